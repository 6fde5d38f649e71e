//! Typed payloads: every serde encoding of the crate lives here.
//!
//! The codec is `bincode` 2.0.1 (pinned exactly: 3.0.0 is a tombstone
//! release that does not build), in its standard configuration
//! (little-endian, variable-length integers), through its serde layer.
//! Decoding is bounded ([`DECODE_LIMIT`]) so that a hostile length prefix
//! cannot make the receiver allocate without limit, and must consume the
//! whole payload: trailing bytes are an error.
//!
//! Raw byte payloads never go through this module.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{Result, RpcError};

/// Largest amount of memory one typed decode may claim, in bytes.
pub const DECODE_LIMIT: usize = 64 << 20;

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<DECODE_LIMIT>()
}

/// Encodes a value.
///
/// # Errors
/// [`RpcError::Codec`] when serde refuses the value.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>> {
    bincode::serde::encode_to_vec(value, config()).map_err(|e| RpcError::Codec(e.to_string()))
}

/// Decodes a value that must fill `bytes` exactly.
///
/// # Errors
/// [`RpcError::Codec`] for bytes that are not an encoding of `T`, or that
/// have bytes left over.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    let (v, used) = bincode::serde::decode_from_slice::<T, _>(bytes, config())
        .map_err(|e| RpcError::Codec(e.to_string()))?;
    if used != bytes.len() {
        return Err(RpcError::Codec(format!(
            "{} trailing bytes after the value",
            bytes.len() - used
        )));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Msg {
        name: String,
        values: Vec<u32>,
        flag: Option<bool>,
    }

    #[test]
    fn round_trip_and_trailing_bytes() {
        let m = Msg {
            name: "x".into(),
            values: vec![1, 300, 70000],
            flag: Some(true),
        };
        let mut b = encode(&m).unwrap();
        assert_eq!(decode::<Msg>(&b).unwrap(), m);
        b.push(0);
        assert!(matches!(decode::<Msg>(&b), Err(RpcError::Codec(_))));
    }

    #[test]
    fn huge_length_prefix_is_refused() {
        // A Vec<u8> claiming u64::MAX elements.
        let mut b = vec![0xff];
        b.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(decode::<Vec<u8>>(&b).is_err());
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode::<Msg>(&data);
            let _ = decode::<(u64, String, Vec<Vec<u16>>)>(&data);
        }
    }
}
