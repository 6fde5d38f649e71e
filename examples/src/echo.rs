//! Typed echo: requests and replies are Rust values, encoded with the RPC
//! layer's serde codec.
//!
//! ```
//! use colibri_bulk_mem::MemTransport;
//! use colibri_examples::echo;
//!
//! let replies = echo::run_local(&MemTransport::default(), &["hello", "colibri"]).unwrap();
//! assert_eq!(replies[0].text, "HELLO HELLO");
//! ```

use colibri_net::Transport;
use colibri_rpc::{RpcConfig, RpcHandle, RpcMachine, Session};
use serde::{Deserialize, Serialize};

use crate::Error;

/// Opcode of the echo service.
pub const OP_ECHO: u32 = 0xec40;

/// What the client asks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EchoRequest {
    /// Text to echo.
    pub text: String,
    /// How many times (1 to 16).
    pub repeat: u32,
    /// Upper-case it.
    pub upper: bool,
}

/// What the server answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EchoReply {
    /// The text, transformed.
    pub text: String,
    /// How many requests this server has answered so far.
    pub served: u64,
}

/// The handler's refusal of a repeat count out of range.
pub const ERR_BAD_REPEAT: i32 = 1001;

/// Makes `m` answer typed echo requests.
pub fn install_server(m: &RpcHandle) {
    let served = std::sync::atomic::AtomicU64::new(0);
    m.on_typed(OP_ECHO, move |q: EchoRequest, _req| {
        if q.repeat == 0 || q.repeat > 16 {
            return Err(ERR_BAD_REPEAT);
        }
        let t = if q.upper {
            q.text.to_uppercase()
        } else {
            q.text
        };
        let text = vec![t; q.repeat as usize].join(" ");
        let served = served.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        Ok(EchoReply { text, served })
    });
}

/// Asks the server to echo `req`.
///
/// # Errors
/// The call's failure (`Remote(ERR_BAD_REPEAT)` for a bad repeat count).
pub fn echo(session: &Session, req: &EchoRequest) -> Result<EchoReply, colibri_rpc::RpcError> {
    session.call_typed(OP_ECHO, req)
}

/// Starts a server and a client in this process, echoes each text twice in
/// upper case, and shuts down.
///
/// # Errors
/// Any failure.
pub fn run_local(xprt: &dyn Transport, texts: &[&str]) -> Result<Vec<EchoReply>, Error> {
    let server = RpcMachine::start_on(xprt, "127.0.0.1:0:1", RpcConfig::default())?;
    install_server(&server);
    let client = RpcMachine::start_on(xprt, "127.0.0.1:0:2", RpcConfig::default())?;
    let session = client.session(server.addr())?;
    let mut out = Vec::new();
    for t in texts {
        let req = EchoRequest {
            text: (*t).to_string(),
            repeat: 2,
            upper: true,
        };
        out.push(echo(&session, &req)?);
    }
    drop(session);
    client.shutdown()?;
    server.shutdown()?;
    Ok(out)
}
