//! # colibri-wire: fixed binary headers, read and written in one place
//!
//! Every hand-written header of the workspace (buffer descriptors, the TCP
//! frame header, the RPC message and item headers, the LNet header and ping
//! buffer) is a fixed layout of little-endian integers and byte strings.
//! This crate is the one place that turns such fields into bytes and back;
//! what the fields mean, and which values are valid, stays with each format.
//!
//! * [`Reader`] walks a `&[u8]` from the front. Every read is bounds-checked
//!   and returns [`Short`] when the bytes run out, never panics, allocates
//!   nothing and borrows byte strings from the input.
//! * [`Writer`] appends to a `&mut Vec<u8>` or fills a fixed buffer
//!   (`&mut [u8]`, `[u8; N]`) from the front.
//! * Both use little-endian byte order unless built with [`Endian::Big`],
//!   which serves layouts that may arrive byte-swapped (an LNet ping buffer
//!   travels in its sender's byte order).
//! * [`gather::gathered`] writes a frame that sits in several small pieces
//!   as one piece (cheaper for the kernel than a gather list).
//!
//! ```
//! use colibri_wire::{Reader, Short, Writer};
//!
//! // A magic number, a version byte and a length-prefixed name.
//! let mut bytes = Vec::new();
//! let mut w = Writer::new(&mut bytes);
//! w.put_u32(u32::from_le_bytes(*b"DEMO"));
//! w.put_u8(1);
//! w.put_u16(5);
//! w.put_bytes(b"hello");
//! assert_eq!(&bytes[..7], b"DEMO\x01\x05\x00");
//!
//! let mut r = Reader::new(&bytes);
//! assert_eq!(&r.u32()?.to_le_bytes(), b"DEMO");
//! assert_eq!(r.u8()?, 1);
//! let n = usize::from(r.u16()?);
//! assert_eq!(r.bytes(n)?, b"hello");
//! assert!(r.is_empty());
//!
//! // Running out of bytes is an error, and consumes nothing.
//! assert_eq!(r.u16(), Err(Short { at: 12, needed: 2, available: 0 }));
//! # Ok::<(), Short>(())
//! ```

#![forbid(unsafe_code)]

pub mod gather;

use std::fmt;

/// Byte order of the integers a [`Reader`] reads or a [`Writer`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Endian {
    /// Least significant byte first: the order of every layout in the
    /// workspace.
    #[default]
    Little,
    /// Most significant byte first: a little-endian layout written by a
    /// big-endian host that did not swap it.
    Big,
}

/// A read that needed more bytes than were left.
///
/// A failed read consumes nothing: the reader stays where it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Short {
    /// Offset of the read from the start of the reader's buffer.
    pub at: usize,
    /// Bytes the read needed.
    pub needed: usize,
    /// Bytes that were left.
    pub available: usize,
}

impl fmt::Display for Short {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "buffer too short: {} bytes needed at offset {}, {} left",
            self.needed, self.at, self.available
        )
    }
}

impl std::error::Error for Short {}

/// A bounds-checked cursor over a byte slice.
///
/// Reads advance the cursor; a read that does not fit returns [`Short`] and
/// leaves the cursor unchanged.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    rest: &'a [u8],
    len: usize,
    endian: Endian,
}

macro_rules! read_ints {
    ($($name:ident: $t:ty),* $(,)?) => {
        $(
            #[doc = concat!("Reads a `", stringify!($t), "` in the reader's byte order.")]
            ///
            /// # Errors
            /// [`Short`] when fewer bytes are left.
            #[inline]
            pub fn $name(&mut self) -> Result<$t, Short> {
                let b = *self.array::<{ size_of::<$t>() }>()?;
                Ok(match self.endian {
                    Endian::Little => <$t>::from_le_bytes(b),
                    Endian::Big => <$t>::from_be_bytes(b),
                })
            }
        )*
    };
}

impl<'a> Reader<'a> {
    /// A little-endian reader at the start of `buf`.
    #[inline]
    #[must_use]
    pub const fn new(buf: &'a [u8]) -> Self {
        Self::with_endian(buf, Endian::Little)
    }

    /// A reader at the start of `buf` that reads integers in `endian` order.
    #[inline]
    #[must_use]
    pub const fn with_endian(buf: &'a [u8], endian: Endian) -> Self {
        Self {
            rest: buf,
            len: buf.len(),
            endian,
        }
    }

    /// The byte order of integer reads.
    #[inline]
    #[must_use]
    pub const fn endian(&self) -> Endian {
        self.endian
    }

    /// Bytes consumed since the start of the buffer.
    #[inline]
    #[must_use]
    pub const fn position(&self) -> usize {
        self.len - self.rest.len()
    }

    /// Bytes left to read.
    #[inline]
    #[must_use]
    pub const fn remaining(&self) -> usize {
        self.rest.len()
    }

    /// True when every byte has been read.
    #[inline]
    #[must_use]
    pub const fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }

    /// The bytes left to read, without consuming them.
    #[inline]
    #[must_use]
    pub const fn rest(&self) -> &'a [u8] {
        self.rest
    }

    #[cold]
    fn short(&self, needed: usize) -> Short {
        Short {
            at: self.position(),
            needed,
            available: self.rest.len(),
        }
    }

    /// Reads the next `N` bytes as an array reference.
    ///
    /// # Errors
    /// [`Short`] when fewer than `N` bytes are left.
    #[inline]
    pub fn array<const N: usize>(&mut self) -> Result<&'a [u8; N], Short> {
        match self.rest.split_first_chunk::<N>() {
            Some((head, rest)) => {
                self.rest = rest;
                Ok(head)
            }
            None => Err(self.short(N)),
        }
    }

    /// Reads the next `n` bytes.
    ///
    /// # Errors
    /// [`Short`] when fewer than `n` bytes are left.
    #[inline]
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], Short> {
        match self.rest.split_at_checked(n) {
            Some((head, rest)) => {
                self.rest = rest;
                Ok(head)
            }
            None => Err(self.short(n)),
        }
    }

    /// Skips the next `n` bytes.
    ///
    /// # Errors
    /// [`Short`] when fewer than `n` bytes are left.
    #[inline]
    pub fn skip(&mut self, n: usize) -> Result<(), Short> {
        self.bytes(n).map(|_| ())
    }

    read_ints! {
        u8: u8,
        u16: u16,
        u32: u32,
        u64: u64,
        i8: i8,
        i16: i16,
        i32: i32,
        i64: i64,
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for &mut Vec<u8> {}
    impl Sealed for &mut [u8] {}
    impl<const N: usize> Sealed for [u8; N] {}
}

/// A buffer a [`Writer`] can write into.
///
/// A borrowed `Vec<u8>` grows: the writer appends after what it already
/// holds. A fixed buffer (`&mut [u8]`, `[u8; N]`) is filled from
/// its first byte and does not grow: writing past its end is a bug of the
/// caller and panics. This trait is sealed; its methods are the writer's
/// plumbing.
pub trait Target: sealed::Sealed {
    /// Where a new writer starts: the end of a vector, 0 in a fixed buffer.
    fn start(&self) -> usize;
    /// Every byte of the buffer (written or not, for a fixed one).
    fn filled(&self) -> &[u8];
    /// Stores `bytes` at index `at`, the writer's position.
    ///
    /// # Panics
    /// When a fixed buffer ends before `at + bytes.len()`.
    fn put_at(&mut self, at: usize, bytes: &[u8]);
    /// Stores `n` zero bytes at index `at`, the writer's position.
    ///
    /// # Panics
    /// When a fixed buffer ends before `at + n`.
    fn zero_at(&mut self, at: usize, n: usize);
}

#[cold]
#[inline(never)]
#[track_caller]
fn overflow(at: usize, n: usize, len: usize) -> ! {
    panic!("colibri-wire: writing {n} bytes at offset {at} overflows a {len}-byte buffer")
}

// An owned `Vec<u8>` is deliberately not a target: inside the writer, its
// length and capacity live in memory that the optimizer cannot keep in
// registers across the calls that grow it, which made encoding measurably
// slower than appending through a `&mut Vec<u8>`.
impl Target for &mut Vec<u8> {
    #[inline]
    fn start(&self) -> usize {
        self.len()
    }
    #[inline]
    fn filled(&self) -> &[u8] {
        self
    }
    #[inline]
    fn put_at(&mut self, at: usize, bytes: &[u8]) {
        debug_assert_eq!(at, self.len());
        self.extend_from_slice(bytes);
    }
    #[inline]
    fn zero_at(&mut self, at: usize, n: usize) {
        debug_assert_eq!(at, self.len());
        self.resize(at + n, 0);
    }
}

impl Target for &mut [u8] {
    #[inline]
    fn start(&self) -> usize {
        0
    }
    #[inline]
    fn filled(&self) -> &[u8] {
        self
    }
    #[inline]
    #[track_caller]
    fn put_at(&mut self, at: usize, bytes: &[u8]) {
        let len = self.len();
        match self.get_mut(at..at + bytes.len()) {
            Some(dst) => dst.copy_from_slice(bytes),
            None => overflow(at, bytes.len(), len),
        }
    }
    #[inline]
    #[track_caller]
    fn zero_at(&mut self, at: usize, n: usize) {
        let len = self.len();
        match self.get_mut(at..at + n) {
            Some(dst) => dst.fill(0),
            None => overflow(at, n, len),
        }
    }
}

impl<const N: usize> Target for [u8; N] {
    #[inline]
    fn start(&self) -> usize {
        0
    }
    #[inline]
    fn filled(&self) -> &[u8] {
        self
    }
    #[inline]
    #[track_caller]
    fn put_at(&mut self, at: usize, bytes: &[u8]) {
        (&mut self[..]).put_at(at, bytes);
    }
    #[inline]
    #[track_caller]
    fn zero_at(&mut self, at: usize, n: usize) {
        (&mut self[..]).zero_at(at, n);
    }
}

/// A cursor that writes integers and bytes into a [`Target`] buffer.
///
/// Over a `&mut Vec<u8>` the writer appends and cannot fail. Over a fixed buffer
/// it fills the buffer from the front and panics when a write does not fit:
/// fixed buffers hold fixed layouts, so an overflow is a bug of the encoder,
/// never a property of the input.
#[derive(Debug)]
pub struct Writer<B> {
    buf: B,
    start: usize,
    pos: usize,
    endian: Endian,
}

macro_rules! put_ints {
    ($($name:ident: $t:ty),* $(,)?) => {
        $(
            #[doc = concat!("Writes a `", stringify!($t), "` in the writer's byte order.")]
            ///
            /// # Panics
            /// When a fixed buffer has no room for it.
            #[inline]
            #[track_caller]
            pub fn $name(&mut self, v: $t) {
                let b = match self.endian {
                    Endian::Little => v.to_le_bytes(),
                    Endian::Big => v.to_be_bytes(),
                };
                self.put_bytes(&b);
            }
        )*
    };
}

impl<B: Target> Writer<B> {
    /// A little-endian writer at the end of a vector or the start of a
    /// fixed buffer.
    #[inline]
    #[must_use]
    pub fn new(buf: B) -> Self {
        Self::with_endian(buf, Endian::Little)
    }

    /// A writer that writes integers in `endian` order.
    #[inline]
    #[must_use]
    pub fn with_endian(buf: B, endian: Endian) -> Self {
        let start = buf.start();
        Self {
            buf,
            start,
            pos: start,
            endian,
        }
    }

    /// The byte order of integer writes.
    #[inline]
    #[must_use]
    pub fn endian(&self) -> Endian {
        self.endian
    }

    /// Bytes written by this writer.
    #[inline]
    #[must_use]
    pub fn position(&self) -> usize {
        self.pos - self.start
    }

    /// The bytes written by this writer (for example, to checksum them
    /// before writing the checksum).
    #[inline]
    #[must_use]
    pub fn written(&self) -> &[u8] {
        &self.buf.filled()[self.start..self.pos]
    }

    /// The buffer: a vector with the bytes appended, or the fixed buffer
    /// (bytes past [`Writer::position`] are as they were).
    #[inline]
    #[must_use]
    pub fn into_inner(self) -> B {
        self.buf
    }

    /// Writes `bytes` as they are.
    ///
    /// # Panics
    /// When a fixed buffer has no room for them.
    #[inline]
    #[track_caller]
    pub fn put_bytes(&mut self, bytes: &[u8]) {
        self.buf.put_at(self.pos, bytes);
        self.pos += bytes.len();
    }

    /// Writes `n` zero bytes (reserved fields, padding).
    ///
    /// # Panics
    /// When a fixed buffer has no room for them.
    #[inline]
    #[track_caller]
    pub fn put_zeros(&mut self, n: usize) {
        self.buf.zero_at(self.pos, n);
        self.pos += n;
    }

    put_ints! {
        put_u8: u8,
        put_u16: u16,
        put_u32: u32,
        put_u64: u64,
        put_i8: i8,
        put_i16: i16,
        put_i32: i32,
        put_i64: i64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn reads_little_endian_in_order() {
        let b = [
            0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e,
            0x0f, 0xff, 0xfe, 0xff, 0xff, 0xff,
        ];
        let mut r = Reader::new(&b);
        assert_eq!(r.endian(), Endian::Little);
        assert_eq!(r.u8(), Ok(0x01));
        assert_eq!(r.u16(), Ok(0x0302));
        assert_eq!(r.u32(), Ok(0x0706_0504));
        assert_eq!(r.u64(), Ok(0x0f0e_0d0c_0b0a_0908));
        assert_eq!(r.position(), 15);
        assert_eq!(r.i8(), Ok(-1));
        assert_eq!(r.i32(), Ok(-2));
        assert!(r.is_empty());
        assert_eq!(r.remaining(), 0);
        assert_eq!(r.rest(), &[] as &[u8]);
    }

    #[test]
    fn reads_big_endian() {
        let b = [0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0xff, 0xfe];
        let mut r = Reader::with_endian(&b, Endian::Big);
        assert_eq!(r.u32(), Ok(0x0102_0304));
        assert_eq!(r.u16(), Ok(0x0506));
        assert_eq!(r.u16(), Ok(0x0708));
        assert_eq!(r.i16(), Ok(-2));
        let mut r = Reader::with_endian(&b, Endian::Big);
        assert_eq!(r.u64(), Ok(0x0102_0304_0506_0708));
        assert_eq!(r.clone().i64(), Err(r.short(8)));
    }

    #[test]
    fn short_reads_fail_and_consume_nothing() {
        let b = [1u8, 2, 3];
        let mut r = Reader::new(&b);
        assert_eq!(r.u8(), Ok(1));
        let short = Short {
            at: 1,
            needed: 4,
            available: 2,
        };
        assert_eq!(r.u32(), Err(short));
        assert_eq!(r.i32(), Err(short));
        assert_eq!(r.array::<4>(), Err(short));
        assert_eq!(r.bytes(4), Err(short));
        assert_eq!(r.skip(4), Err(short));
        assert_eq!(r.u64().unwrap_err().needed, 8);
        assert_eq!(r.bytes(usize::MAX).unwrap_err().needed, usize::MAX);
        assert_eq!((r.position(), r.remaining()), (1, 2));
        assert_eq!(r.rest(), &[2, 3]);
        assert_eq!(r.bytes(2), Ok(&[2u8, 3][..]));
        assert_eq!(r.bytes(0), Ok(&[][..]));
        assert_eq!(
            r.u8().unwrap_err().to_string(),
            "buffer too short: 1 bytes needed at offset 3, 0 left"
        );
        let mut e = Reader::new(&[]);
        assert_eq!(e.u8().unwrap_err().at, 0);
        assert_eq!(e.skip(0), Ok(()));
    }

    #[test]
    fn borrowed_bytes_outlive_the_reader() {
        let b = b"abcdef".to_vec();
        let (x, y) = {
            let mut r = Reader::new(&b);
            r.skip(1).unwrap();
            let x = r.bytes(2).unwrap();
            let y = r.array::<3>().unwrap();
            (x, y)
        };
        assert_eq!((x, y), (&b"bc"[..], b"def"));
    }

    #[test]
    fn writes_into_vectors_and_fixed_buffers() {
        let mut v = vec![0xaa];
        let mut w = Writer::new(&mut v);
        w.put_u16(0x0201);
        w.put_zeros(2);
        w.put_i32(-2);
        assert_eq!(w.position(), 8);
        assert_eq!(w.written(), &[1, 2, 0, 0, 0xfe, 0xff, 0xff, 0xff]);
        assert_eq!(v.len(), 9);

        let mut w = Writer::new([0x55u8; 8]);
        w.put_u8(9);
        w.put_bytes(b"xy");
        assert_eq!(w.written(), &[9, b'x', b'y']);
        assert_eq!(
            w.into_inner(),
            [9, b'x', b'y', 0x55, 0x55, 0x55, 0x55, 0x55]
        );

        let mut big = [0u8; 10];
        let mut w = Writer::with_endian(&mut big[..], Endian::Big);
        assert_eq!(w.endian(), Endian::Big);
        w.put_u64(0x0102_0304_0506_0708);
        w.put_i16(-2);
        assert_eq!(big, [1, 2, 3, 4, 5, 6, 7, 8, 0xff, 0xfe]);

        let mut v = Vec::new();
        let mut w = Writer::new(&mut v);
        w.put_i64(-1);
        w.put_u32(7);
        w.put_i8(-3);
        assert_eq!(
            v,
            [
                0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 7, 0, 0, 0, 0xfd
            ]
        );
    }

    #[test]
    #[should_panic(expected = "writing 4 bytes at offset 2 overflows a 5-byte buffer")]
    fn fixed_overflow_panics() {
        let mut w = Writer::new([0u8; 5]);
        w.put_u16(1);
        w.put_u32(2);
    }

    #[test]
    #[should_panic(expected = "writing 3 bytes at offset 0 overflows a 2-byte buffer")]
    fn fixed_zero_overflow_panics() {
        let mut b = [0u8; 2];
        Writer::new(&mut b[..]).put_zeros(3);
    }

    /// One field of a random layout.
    #[derive(Debug, Clone, PartialEq)]
    enum Field {
        U8(u8),
        U16(u16),
        U32(u32),
        U64(u64),
        I8(i8),
        I16(i16),
        I32(i32),
        I64(i64),
        Bytes(Vec<u8>),
        Zeros(usize),
    }

    impl Field {
        fn size(&self) -> usize {
            match self {
                Self::U8(_) | Self::I8(_) => 1,
                Self::U16(_) | Self::I16(_) => 2,
                Self::U32(_) | Self::I32(_) => 4,
                Self::U64(_) | Self::I64(_) => 8,
                Self::Bytes(b) => b.len(),
                Self::Zeros(n) => *n,
            }
        }

        /// The bytes std's conversions give, independently of the crate.
        fn std_bytes(&self, endian: Endian) -> Vec<u8> {
            macro_rules! conv {
                ($v:expr) => {
                    match endian {
                        Endian::Little => $v.to_le_bytes().to_vec(),
                        Endian::Big => $v.to_be_bytes().to_vec(),
                    }
                };
            }
            match self {
                Self::U8(v) => vec![*v],
                Self::U16(v) => conv!(v),
                Self::U32(v) => conv!(v),
                Self::U64(v) => conv!(v),
                Self::I8(v) => conv!(v),
                Self::I16(v) => conv!(v),
                Self::I32(v) => conv!(v),
                Self::I64(v) => conv!(v),
                Self::Bytes(b) => b.clone(),
                Self::Zeros(n) => vec![0; *n],
            }
        }

        fn write<B: Target>(&self, w: &mut Writer<B>) {
            match self {
                Self::U8(v) => w.put_u8(*v),
                Self::U16(v) => w.put_u16(*v),
                Self::U32(v) => w.put_u32(*v),
                Self::U64(v) => w.put_u64(*v),
                Self::I8(v) => w.put_i8(*v),
                Self::I16(v) => w.put_i16(*v),
                Self::I32(v) => w.put_i32(*v),
                Self::I64(v) => w.put_i64(*v),
                Self::Bytes(b) => w.put_bytes(b),
                Self::Zeros(n) => w.put_zeros(*n),
            }
        }

        /// Reads a field of the same shape.
        fn read(&self, r: &mut Reader<'_>) -> Result<Self, Short> {
            Ok(match self {
                Self::U8(_) => Self::U8(r.u8()?),
                Self::U16(_) => Self::U16(r.u16()?),
                Self::U32(_) => Self::U32(r.u32()?),
                Self::U64(_) => Self::U64(r.u64()?),
                Self::I8(_) => Self::I8(r.i8()?),
                Self::I16(_) => Self::I16(r.i16()?),
                Self::I32(_) => Self::I32(r.i32()?),
                Self::I64(_) => Self::I64(r.i64()?),
                Self::Bytes(b) => Self::Bytes(r.bytes(b.len())?.to_vec()),
                Self::Zeros(n) => {
                    let z = r.bytes(*n)?;
                    assert!(z.iter().all(|&b| b == 0));
                    Self::Zeros(*n)
                }
            })
        }
    }

    fn any_field() -> impl Strategy<Value = Field> {
        prop_oneof![
            any::<u8>().prop_map(Field::U8),
            any::<u16>().prop_map(Field::U16),
            any::<u32>().prop_map(Field::U32),
            any::<u64>().prop_map(Field::U64),
            any::<i8>().prop_map(Field::I8),
            any::<i16>().prop_map(Field::I16),
            any::<i32>().prop_map(Field::I32),
            any::<i64>().prop_map(Field::I64),
            proptest::collection::vec(any::<u8>(), 0..20).prop_map(Field::Bytes),
            (0usize..20).prop_map(Field::Zeros),
        ]
    }

    fn any_endian() -> impl Strategy<Value = Endian> {
        prop_oneof![Just(Endian::Little), Just(Endian::Big)]
    }

    proptest! {
        #[test]
        fn layouts_round_trip(
            fields in proptest::collection::vec(any_field(), 0..24),
            endian in any_endian(),
            prefix in proptest::collection::vec(any::<u8>(), 0..4),
        ) {
            let want: Vec<u8> = fields.iter().flat_map(|f| f.std_bytes(endian)).collect();
            let size: usize = fields.iter().map(Field::size).sum();
            prop_assert_eq!(want.len(), size);

            // Appending to a vector that already holds bytes.
            let mut v = prefix.clone();
            let mut w = Writer::with_endian(&mut v, endian);
            for f in &fields {
                f.write(&mut w);
            }
            prop_assert_eq!(w.position(), size);
            prop_assert_eq!(w.written(), &want[..]);
            prop_assert_eq!(&v[..prefix.len()], &prefix[..]);
            prop_assert_eq!(&v[prefix.len()..], &want[..]);

            // Filling a fixed buffer of exactly the right size.
            let mut fixed = vec![0x5a; size];
            let mut w = Writer::with_endian(&mut fixed[..], endian);
            for f in &fields {
                f.write(&mut w);
            }
            prop_assert_eq!(w.position(), size);
            prop_assert_eq!(&fixed, &want);

            // Reading back.
            let mut r = Reader::with_endian(&want, endian);
            for f in &fields {
                let at = r.position();
                prop_assert_eq!(&f.read(&mut r).unwrap(), f);
                prop_assert_eq!(r.position(), at + f.size());
            }
            prop_assert!(r.is_empty());
        }

        #[test]
        fn truncated_layouts_fail_cleanly(
            fields in proptest::collection::vec(any_field(), 1..24),
            endian in any_endian(),
            cut in any::<usize>(),
        ) {
            let mut bytes = Vec::new();
            let mut w = Writer::with_endian(&mut bytes, endian);
            for f in &fields {
                f.write(&mut w);
            }
            let cut = cut % (bytes.len() + 1);
            let mut r = Reader::with_endian(&bytes[..cut], endian);
            let mut failed = false;
            for f in &fields {
                let (at, left) = (r.position(), r.remaining());
                match f.read(&mut r) {
                    Ok(got) => prop_assert_eq!(&got, f),
                    Err(e) => {
                        prop_assert!(f.size() > left);
                        prop_assert_eq!(e, Short { at, needed: f.size(), available: left });
                        prop_assert_eq!((r.position(), r.remaining()), (at, left));
                        failed = true;
                        break;
                    }
                }
            }
            prop_assert_eq!(failed, cut < bytes.len());
        }

        #[test]
        fn random_reads_never_panic(
            bytes in proptest::collection::vec(any::<u8>(), 0..64),
            ops in proptest::collection::vec((0u8..8, 0usize..80), 0..32),
        ) {
            let mut r = Reader::new(&bytes);
            for (op, n) in ops {
                let before = r.position();
                let ok = match op {
                    0 => r.u8().is_ok(),
                    1 => r.u16().is_ok(),
                    2 => r.u32().is_ok(),
                    3 => r.u64().is_ok(),
                    4 => r.i32().is_ok(),
                    5 => r.bytes(n).is_ok(),
                    6 => r.skip(n).is_ok(),
                    _ => r.array::<3>().is_ok(),
                };
                prop_assert!(ok || r.position() == before);
                prop_assert_eq!(r.position() + r.remaining(), bytes.len());
            }
        }
    }
}
