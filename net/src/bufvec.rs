//! Scatter-gather memory: [`BufVec`].
//!
//! A `BufVec` is a vector of fixed-size segments. Its shape (number and sizes
//! of segments) is set when it is built and never changes, so a transport
//! may pin or register each segment once. Data is copied in and out by byte
//! offset over the whole vector; the helpers here walk segment boundaries so
//! callers never do that arithmetic themselves, and two vectors of different
//! shapes can be copied into each other directly.

use std::fmt;
use std::io::{IoSlice, IoSliceMut};

use crate::error::{NetError, Result};

/// A scatter-gather vector of fixed-size memory segments.
#[derive(Clone, PartialEq, Eq)]
pub struct BufVec {
    segs: Vec<Box<[u8]>>,
    /// `starts[i]` is the offset of segment `i`; `starts[segs.len()]` the
    /// total length.
    starts: Vec<usize>,
}

impl fmt::Debug for BufVec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufVec")
            .field("len", &self.len())
            .field("segments", &self.segs.len())
            .finish()
    }
}

/// The pieces covering `[offset, offset + len)` of a vector whose segment
/// offsets are `starts` (one more entry than segments: the total length at
/// the end). The range must be in bounds.
fn pieces(starts: &[usize], offset: usize, len: usize) -> impl Iterator<Item = Piece> + '_ {
    let nsegs = starts.len() - 1;
    // Index of the segment holding `offset`: the last start <= offset.
    let first = starts[..nsegs]
        .partition_point(|&s| s <= offset)
        .saturating_sub(1);
    let end = offset + len;
    (first..nsegs)
        .take_while(move |&seg| starts[seg] < end)
        .map(move |seg| {
            let seg_start = starts[seg];
            let lo = offset.max(seg_start) - seg_start;
            let hi = end.min(starts[seg + 1]) - seg_start;
            Piece {
                seg,
                start: lo,
                end: hi,
            }
        })
        .filter(|p| p.end > p.start)
}

impl Default for BufVec {
    /// An empty vector.
    fn default() -> Self {
        Self::from_segments(Vec::new())
    }
}

/// One contiguous piece of a byte range over a [`BufVec`]: segment index and
/// the range inside that segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Piece {
    seg: usize,
    start: usize,
    end: usize,
}

impl BufVec {
    /// A zeroed vector of `nr_segs` segments of `seg_size` bytes each.
    pub fn new(nr_segs: usize, seg_size: usize) -> Self {
        Self::from_boxed(
            (0..nr_segs)
                .map(|_| vec![0u8; seg_size].into_boxed_slice())
                .collect(),
        )
    }

    /// A zeroed vector of `total` bytes cut into segments of `seg_size`
    /// bytes (the last one may be shorter). `seg_size` 0 means one segment.
    pub fn with_len(total: usize, seg_size: usize) -> Self {
        if seg_size == 0 || total <= seg_size {
            return Self::from_boxed(vec![vec![0u8; total].into_boxed_slice()]);
        }
        let mut segs = Vec::with_capacity(total.div_ceil(seg_size));
        let mut left = total;
        while left > 0 {
            let n = left.min(seg_size);
            segs.push(vec![0u8; n].into_boxed_slice());
            left -= n;
        }
        Self::from_boxed(segs)
    }

    /// A vector over the given segments, in order.
    pub fn from_segments(segs: Vec<Vec<u8>>) -> Self {
        Self::from_boxed(segs.into_iter().map(Vec::into_boxed_slice).collect())
    }

    /// A one-segment vector holding a copy of `data`.
    pub fn from_bytes(data: &[u8]) -> Self {
        Self::from_boxed(vec![data.to_vec().into_boxed_slice()])
    }

    fn from_boxed(segs: Vec<Box<[u8]>>) -> Self {
        let mut starts = Vec::with_capacity(segs.len() + 1);
        let mut off = 0usize;
        for s in &segs {
            starts.push(off);
            off += s.len();
        }
        starts.push(off);
        Self { segs, starts }
    }

    /// Total number of bytes.
    pub fn len(&self) -> usize {
        self.starts[self.segs.len()]
    }

    /// True when the vector holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of segments.
    pub fn nr_segments(&self) -> usize {
        self.segs.len()
    }

    /// The segments, in order.
    pub fn segments(&self) -> impl ExactSizeIterator<Item = &[u8]> {
        self.segs.iter().map(|s| &s[..])
    }

    /// The segments, mutable, in order.
    pub fn segments_mut(&mut self) -> impl ExactSizeIterator<Item = &mut [u8]> {
        self.segs.iter_mut().map(|s| &mut s[..])
    }

    /// Size of the largest segment (0 for an empty vector).
    pub fn max_segment_size(&self) -> usize {
        self.segs.iter().map(|s| s.len()).max().unwrap_or(0)
    }

    /// Takes the segments out, consuming the vector.
    pub fn into_segments(self) -> Vec<Box<[u8]>> {
        self.segs
    }

    /// Checks that `[offset, offset + len)` lies inside the vector.
    pub fn check_range(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len() => Ok(()),
            _ => Err(NetError::InvalidArgument(format!(
                "range {offset}+{len} outside a buffer of {} bytes",
                self.len()
            ))),
        }
    }

    /// The pieces covering `[offset, offset + len)`, which must be in range.
    fn pieces(&self, offset: usize, len: usize) -> impl Iterator<Item = Piece> + '_ {
        pieces(&self.starts, offset, len)
    }

    /// Copies `src` into the vector at `offset`.
    ///
    /// # Errors
    /// `InvalidArgument` when the range does not fit.
    pub fn copy_in(&mut self, offset: usize, src: &[u8]) -> Result<()> {
        self.check_range(offset, src.len())?;
        if let [only] = &mut self.segs[..] {
            // One segment (a message buffer, usually): no piece walk.
            only[offset..offset + src.len()].copy_from_slice(src);
            return Ok(());
        }
        let mut at = 0;
        for p in pieces(&self.starts, offset, src.len()) {
            let n = p.end - p.start;
            self.segs[p.seg][p.start..p.end].copy_from_slice(&src[at..at + n]);
            at += n;
        }
        Ok(())
    }

    /// Copies `dst.len()` bytes starting at `offset` into `dst`.
    ///
    /// # Errors
    /// `InvalidArgument` when the range does not fit.
    pub fn copy_out(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check_range(offset, dst.len())?;
        let mut at = 0;
        for p in self.pieces(offset, dst.len()) {
            let n = p.end - p.start;
            dst[at..at + n].copy_from_slice(&self.segs[p.seg][p.start..p.end]);
            at += n;
        }
        Ok(())
    }

    /// A new `Vec` holding `[offset, offset + len)`.
    ///
    /// # Errors
    /// `InvalidArgument` when the range does not fit.
    pub fn to_vec(&self, offset: usize, len: usize) -> Result<Vec<u8>> {
        let mut v = vec![0u8; len];
        self.copy_out(offset, &mut v)?;
        Ok(v)
    }

    /// Copies `len` bytes from `src` at `src_offset` into this vector at
    /// `offset`. The two vectors may have different shapes; each byte is
    /// copied once, segment piece by segment piece.
    ///
    /// # Errors
    /// `InvalidArgument` when either range does not fit.
    pub fn copy_from_bufvec(
        &mut self,
        offset: usize,
        src: &BufVec,
        src_offset: usize,
        len: usize,
    ) -> Result<()> {
        self.check_range(offset, len)?;
        src.check_range(src_offset, len)?;
        let mut src_pieces = src.pieces(src_offset, len);
        let mut cur: Option<Piece> = src_pieces.next();
        for d in pieces(&self.starts, offset, len) {
            let mut d_at = d.start;
            while d_at < d.end {
                let Some(s) = cur.as_mut() else {
                    // Both ranges were checked to hold `len` bytes.
                    return Err(NetError::InvalidArgument("source range exhausted".into()));
                };
                let n = (d.end - d_at).min(s.end - s.start);
                self.segs[d.seg][d_at..d_at + n]
                    .copy_from_slice(&src.segs[s.seg][s.start..s.start + n]);
                d_at += n;
                s.start += n;
                if s.start == s.end {
                    cur = src_pieces.next();
                }
            }
        }
        Ok(())
    }

    /// I/O slices over `[offset, offset + len)`, for vectored writes.
    ///
    /// # Errors
    /// `InvalidArgument` when the range does not fit.
    pub fn io_slices(&self, offset: usize, len: usize) -> Result<Vec<IoSlice<'_>>> {
        let mut v = Vec::new();
        self.extend_io_slices(offset, len, &mut v)?;
        Ok(v)
    }

    /// Like [`BufVec::io_slices`], appending to `out` (no allocation of
    /// its own, for the per-message write paths).
    ///
    /// # Errors
    /// `InvalidArgument` when the range does not fit.
    pub fn extend_io_slices<'a>(
        &'a self,
        offset: usize,
        len: usize,
        out: &mut impl Extend<IoSlice<'a>>,
    ) -> Result<()> {
        self.check_range(offset, len)?;
        out.extend(
            self.pieces(offset, len)
                .map(|p| IoSlice::new(&self.segs[p.seg][p.start..p.end])),
        );
        Ok(())
    }

    /// Calls `f` with each contiguous slice over `[offset, offset + len)`,
    /// in order: [`BufVec::extend_io_slices`] without an iterator adaptor
    /// (the per-message write path; a one-segment vector takes one slice).
    ///
    /// # Errors
    /// `InvalidArgument` when the range does not fit.
    #[inline]
    pub fn each_slice<'a>(
        &'a self,
        offset: usize,
        len: usize,
        mut f: impl FnMut(&'a [u8]),
    ) -> Result<()> {
        self.check_range(offset, len)?;
        if let [only] = &self.segs[..] {
            if len > 0 {
                f(&only[offset..offset + len]);
            }
            return Ok(());
        }
        for p in self.pieces(offset, len) {
            f(&self.segs[p.seg][p.start..p.end]);
        }
        Ok(())
    }

    /// Mutable slices over `[offset, offset + len)`, for vectored reads or
    /// direct writes into the vector's memory.
    ///
    /// # Errors
    /// `InvalidArgument` when the range does not fit.
    pub fn slices_mut(&mut self, offset: usize, len: usize) -> Result<Vec<&mut [u8]>> {
        self.check_range(offset, len)?;
        let mut out = Vec::new();
        let mut rest: &mut [Box<[u8]>] = &mut self.segs;
        let mut base = 0usize;
        for p in pieces(&self.starts, offset, len) {
            let (head, tail) = rest.split_at_mut(p.seg - base + 1);
            let seg = &mut head[p.seg - base];
            out.push(&mut seg[p.start..p.end]);
            base = p.seg + 1;
            rest = tail;
        }
        Ok(out)
    }

    /// Mutable I/O slices over `[offset, offset + len)`, for vectored reads.
    ///
    /// # Errors
    /// `InvalidArgument` when the range does not fit.
    pub fn io_slices_mut(&mut self, offset: usize, len: usize) -> Result<Vec<IoSliceMut<'_>>> {
        Ok(self
            .slices_mut(offset, len)?
            .into_iter()
            .map(IoSliceMut::new)
            .collect())
    }

    /// Slices over `[offset, offset + len)`.
    ///
    /// # Errors
    /// `InvalidArgument` when the range does not fit.
    pub fn slices(&self, offset: usize, len: usize) -> Result<Vec<&[u8]>> {
        self.check_range(offset, len)?;
        Ok(self
            .pieces(offset, len)
            .map(|p| &self.segs[p.seg][p.start..p.end])
            .collect())
    }

    /// Fills the whole vector with `byte`.
    pub fn fill(&mut self, byte: u8) {
        for s in &mut self.segs {
            s.fill(byte);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn shaped(sizes: &[usize]) -> BufVec {
        BufVec::from_segments(sizes.iter().map(|&n| vec![0u8; n]).collect())
    }

    #[test]
    fn shapes_and_lengths() {
        let b = BufVec::new(3, 4);
        assert_eq!(b.len(), 12);
        assert_eq!(b.nr_segments(), 3);
        let b = BufVec::with_len(10, 4);
        assert_eq!(
            b.segments().map(<[u8]>::len).collect::<Vec<_>>(),
            vec![4, 4, 2]
        );
        let b = BufVec::with_len(3, 0);
        assert_eq!(b.nr_segments(), 1);
        assert!(BufVec::new(0, 4).is_empty());
    }

    #[test]
    fn copy_in_and_out_across_segments() {
        let mut b = shaped(&[3, 1, 5]);
        b.copy_in(2, b"abcdef").unwrap();
        assert_eq!(b.to_vec(2, 6).unwrap(), b"abcdef");
        assert_eq!(b.to_vec(0, 9).unwrap(), b"\0\0abcdef\0");
        assert!(b.copy_in(5, b"12345").is_err());
        assert!(b.to_vec(usize::MAX, 2).is_err());
    }

    #[test]
    fn empty_segments_are_skipped() {
        let mut b = shaped(&[0, 2, 0, 3, 0]);
        b.copy_in(0, b"hello").unwrap();
        assert_eq!(b.to_vec(0, 5).unwrap(), b"hello");
        assert_eq!(b.slices(1, 3).unwrap(), vec![&b"e"[..], &b"ll"[..]]);
    }

    #[test]
    fn slices_mut_cover_the_range() {
        let mut b = shaped(&[2, 2, 2]);
        for (i, s) in b.slices_mut(1, 4).unwrap().into_iter().enumerate() {
            s.fill(b'a' + i as u8);
        }
        assert_eq!(b.to_vec(0, 6).unwrap(), b"\0abbc\0");
    }

    proptest! {
        #[test]
        fn copy_between_any_shapes(
            src_sizes in proptest::collection::vec(0usize..9, 1..6),
            dst_sizes in proptest::collection::vec(0usize..9, 1..6),
            seed in any::<u8>(),
            so in 0usize..8, doff in 0usize..8, len in 0usize..40,
        ) {
            let mut src = shaped(&src_sizes);
            let data: Vec<u8> = (0..src.len()).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect();
            src.copy_in(0, &data).unwrap();
            let mut dst = shaped(&dst_sizes);
            let res = dst.copy_from_bufvec(doff, &src, so, len);
            let fits = so + len <= src.len() && doff + len <= dst.len();
            prop_assert_eq!(res.is_ok(), fits);
            if fits {
                prop_assert_eq!(dst.to_vec(doff, len).unwrap(), data[so..so + len].to_vec());
                let io: usize = dst.io_slices(doff, len).unwrap().iter().map(|s| s.len()).sum();
                prop_assert_eq!(io, len);
            }
        }
    }
}
