//! One queue operation the node's tables share.

use std::collections::VecDeque;

/// Takes out of `q` the items `pred` selects, in queue order, keeping the
/// others in theirs (`pred` sees each item once).
pub(crate) fn take_where<T>(q: &mut VecDeque<T>, mut pred: impl FnMut(&T) -> bool) -> Vec<T> {
    let mut taken = Vec::new();
    let mut kept = VecDeque::with_capacity(q.len());
    for item in q.drain(..) {
        if pred(&item) {
            taken.push(item);
        } else {
            kept.push_back(item);
        }
    }
    *q = kept;
    taken
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_the_selected_items_and_keeps_the_order_of_both() {
        let mut q: VecDeque<u32> = (1..=6).collect();
        assert_eq!(take_where(&mut q, |&i| i % 3 == 0), vec![3, 6]);
        assert_eq!(q, VecDeque::from(vec![1, 2, 4, 5]));
        assert!(take_where(&mut q, |_| false).is_empty());
        assert_eq!(q.len(), 4);
    }
}
