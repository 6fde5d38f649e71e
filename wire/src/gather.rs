//! Writing a frame that sits in several pieces (a header, a payload, the
//! next frame's header): small ones are cheaper to copy into one piece
//! and send with a plain write than to hand to the kernel as a gather
//! list.
//!
//! Measured on loopback TCP (BENCHMARKS.md, issue 9): a 200-byte round
//! trip message written as three pieces cost 0.3 us more per round trip
//! than the same bytes in one piece, and 1.2 us more at 4 KiB; copying up
//! to 16 KiB into one piece first was cheaper than either. Above that the
//! copy costs more than it saves, and the pieces go as they are.

use std::cell::RefCell;
use std::io::IoSlice;

/// Largest total, in bytes, of pieces that [`gathered`] copies into one.
pub const GATHER_MAX: usize = 16 << 10;

thread_local! {
    /// The calling thread's buffer for copied pieces (at most
    /// [`GATHER_MAX`] bytes, kept for the thread's life).
    static STAGE: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// What [`gathered`] hands to its write function.
#[derive(Debug)]
pub enum Pieces<'a, 'b> {
    /// The pieces copied into one (a plain write).
    One(&'a [u8]),
    /// The pieces as they were (a vectored write).
    Many(&'a [IoSlice<'b>]),
}

/// Calls `write` with `iov` copied into one piece of the calling thread's
/// buffer when it is several pieces of at most [`GATHER_MAX`] bytes in
/// all, else with `iov` as it is, and returns what `write` returned
/// (bytes written, possibly fewer than asked for: the caller goes on from
/// there as after any write).
///
/// ```
/// use std::io::{IoSlice, Write};
/// use colibri_wire::gather::{Pieces, gathered};
///
/// let mut out = Vec::new();
/// let iov = [IoSlice::new(b"head"), IoSlice::new(b"body")];
/// let n = gathered(&iov, |p| match p {
///     Pieces::One(b) => out.write(b),
///     Pieces::Many(v) => out.write_vectored(v),
/// })?;
/// assert_eq!((n, &out[..]), (8, &b"headbody"[..]));
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn gathered<R>(iov: &[IoSlice<'_>], write: impl FnOnce(Pieces<'_, '_>) -> R) -> R {
    if iov.len() < 2 {
        return match iov.first() {
            Some(s) => write(Pieces::One(s)),
            None => write(Pieces::Many(iov)),
        };
    }
    let total: usize = iov.iter().map(|s| s.len()).sum();
    if total > GATHER_MAX {
        return write(Pieces::Many(iov));
    }
    STAGE.with(|stage| match stage.try_borrow_mut() {
        Ok(mut stage) => {
            stage.clear();
            for s in iov {
                stage.extend_from_slice(s);
            }
            write(Pieces::One(&stage))
        }
        // A write inside a write on the same thread: not worth a second
        // buffer.
        Err(_) => write(Pieces::Many(iov)),
    })
}

#[cfg(test)]
mod tests {
    use std::io::IoSlice;

    use super::{GATHER_MAX, Pieces, gathered};

    #[derive(Debug, PartialEq)]
    enum Way {
        One(Vec<u8>),
        Many(usize),
    }

    fn way(iov: &[IoSlice<'_>]) -> Way {
        gathered(iov, |p| match p {
            Pieces::One(b) => Way::One(b.to_vec()),
            Pieces::Many(v) => Way::Many(v.len()),
        })
    }

    #[test]
    fn small_pieces_become_one_large_ones_stay() {
        assert_eq!(way(&[]), Way::Many(0));
        assert_eq!(way(&[IoSlice::new(b"abc")]), Way::One(b"abc".to_vec()));
        assert_eq!(
            way(&[IoSlice::new(b"ab"), IoSlice::new(b""), IoSlice::new(b"cd")]),
            Way::One(b"abcd".to_vec())
        );
        let big = vec![7u8; GATHER_MAX];
        assert_eq!(
            way(&[IoSlice::new(&big[..10]), IoSlice::new(&big[10..])]),
            Way::One(big.clone())
        );
        assert_eq!(way(&[IoSlice::new(&big), IoSlice::new(b"x")]), Way::Many(2));
    }

    #[test]
    fn a_write_inside_a_write_goes_as_it_is() {
        let iov = [IoSlice::new(b"ab"), IoSlice::new(b"cd")];
        let inner = gathered(&iov, |_| way(&iov));
        assert_eq!(inner, Way::Many(2));
    }
}
