//! CPU sets for [`Tm::confine`](crate::tm::TmHandle::confine): the one
//! check every transport makes of the set it is given, and pinning a
//! transport's thread to a CPU.

use crate::error::{NetError, Result};

/// Checks a CPU set given to `confine`: not empty, and every CPU one this
/// process may run on. Returns the set's first CPU (a transport with one
/// thread per machine pins it there).
///
/// # Errors
/// [`NetError::InvalidArgument`] naming the CPU that does not exist, or
/// saying the set is empty.
pub fn check_cpu_set(cpus: &[usize]) -> Result<usize> {
    let avail = core_affinity::get_core_ids().map_or(0, |c| c.len());
    if let Some(bad) = cpus.iter().find(|&&c| c >= avail.max(1)) {
        return Err(NetError::InvalidArgument(format!(
            "CPU {bad} does not exist ({avail} available)"
        )));
    }
    cpus.first()
        .copied()
        .ok_or_else(|| NetError::InvalidArgument("empty CPU set".into()))
}

/// Pins the calling thread to `cpu`; a failure is logged (`what` names
/// the thread) and otherwise ignored, as the set was checked when it was
/// given.
pub fn pin_current_thread(cpu: usize, what: &str) {
    if !core_affinity::set_for_current(core_affinity::CoreId { id: cpu }) {
        tracing::warn!(cpu, what, "could not pin the thread");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_and_absent_cpus_are_refused() {
        assert!(matches!(
            check_cpu_set(&[]),
            Err(NetError::InvalidArgument(_))
        ));
        let e = check_cpu_set(&[0, 100_000]).unwrap_err();
        assert!(e.to_string().contains("CPU 100000 does not exist"), "{e}");
        assert_eq!(check_cpu_set(&[0]).unwrap(), 0);
    }
}
