//! A generational slab: the table of queued buffers of a transfer machine.
//!
//! Keys pack a slot index (low 32 bits) and a generation (high 32 bits). A
//! slot's generation changes every time it is freed, so a key that outlived
//! its entry (a stale descriptor, a late completion) never finds the entry
//! that reused the slot.

#[derive(Debug)]
struct Entry<T> {
    generation: u32,
    val: Option<T>,
}

/// A generational slab of `T`.
#[derive(Debug)]
pub(crate) struct Slab<T> {
    entries: Vec<Entry<T>>,
    free: Vec<u32>,
    len: usize,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
            free: Vec::new(),
            len: 0,
        }
    }
}

fn split(key: u64) -> (usize, u32) {
    ((key & 0xffff_ffff) as usize, (key >> 32) as u32)
}

impl<T> Slab<T> {
    /// The key the next insertion will return.
    pub(crate) fn next_key(&self) -> u64 {
        let (idx, generation) = match self.free.last() {
            Some(&i) => (i as usize, self.entries[i as usize].generation),
            None => (self.entries.len(), 1),
        };
        (u64::from(generation) << 32) | idx as u64
    }

    /// Inserts a value built from its key; returns the key.
    pub(crate) fn insert_with(&mut self, f: impl FnOnce(u64) -> T) -> u64 {
        let idx = match self.free.pop() {
            Some(i) => i as usize,
            None => {
                // Generation starts at 1 so that key 0 is never valid.
                self.entries.push(Entry {
                    generation: 1,
                    val: None,
                });
                self.entries.len() - 1
            }
        };
        let e = &mut self.entries[idx];
        let key = (u64::from(e.generation) << 32) | idx as u64;
        e.val = Some(f(key));
        self.len += 1;
        key
    }

    /// The value under `key`, if the key is current.
    pub(crate) fn get(&self, key: u64) -> Option<&T> {
        let (idx, generation) = split(key);
        self.entries
            .get(idx)
            .filter(|e| e.generation == generation)
            .and_then(|e| e.val.as_ref())
    }

    /// Removes and returns the value under `key`, if the key is current.
    pub(crate) fn remove(&mut self, key: u64) -> Option<T> {
        let (idx, generation) = split(key);
        let e = self
            .entries
            .get_mut(idx)
            .filter(|e| e.generation == generation)?;
        let v = e.val.take()?;
        e.generation = e.generation.wrapping_add(1).max(1);
        self.free.push(idx as u32);
        self.len -= 1;
        Some(v)
    }

    /// Number of values.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Iterates over the values.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.entries.iter().filter_map(|e| e.val.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_keys_miss_reused_slots() {
        let mut s = Slab::default();
        assert_eq!(s.next_key(), 1 << 32);
        let a = s.insert_with(|k| (k, "a"));
        assert_eq!(a, 1 << 32);
        assert_eq!(s.get(a).unwrap().1, "a");
        assert_eq!(s.remove(a).unwrap().1, "a");
        let next = s.next_key();
        let b = s.insert_with(|k| (k, "b"));
        assert_eq!(b, next);
        assert_eq!(a & 0xffff_ffff, b & 0xffff_ffff, "slot reused");
        assert_ne!(a, b);
        assert!(s.get(a).is_none());
        assert!(s.remove(a).is_none());
        assert_eq!(s.len(), 1);
        assert!(s.get(0).is_none());
        assert_eq!(s.iter().count(), 1);
    }
}
