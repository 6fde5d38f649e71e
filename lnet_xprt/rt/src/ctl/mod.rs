//! The control socket of a node run as a process (`colibri lnet run`):
//! `lnetctl`'s commands sent to a running node.
//!
//! ## Protocol
//!
//! A Unix stream socket, mode 0600 (only its owner may change the node).
//! One request per connection: the client writes a frame, the server
//! answers with one or more frames (`more: true` on the partial ones, e.g.
//! the selftest's per-interval figures) and closes. A frame is a 4-byte
//! big-endian length (at most [`MAX_FRAME`]) and that many bytes of JSON:
//!
//! * request: `{"version": 1, "cmd": {"cmd": "net_show", ...}}`
//!   ([`Request`], [`Command`]);
//! * reply: `{"version": 1, "more": false, "result": {"Ok": DOC}}` or
//!   `{"Err": {"op": "add", "object": "route", "errno": 22, "descr": "..."}}`
//!   ([`Reply`], [`Failure`]).
//!
//! A request with another version gets an `EPROTO` failure naming the
//! version the node speaks (and the client refuses replies of another
//! version the same way), so a newer client and an older node fail clearly.
//! Every client call has a deadline ([`call`]); the server gives a client
//! [`REQUEST_READ_TIMEOUT`] to send its request.
//!
//! ## Example
//!
//! A node from a configuration, its control socket, and `net show`:
//!
//! ```
//! use std::time::Duration;
//! use colibri_lnet_rt::conf::NodeConf;
//! use colibri_lnet_rt::ctl::{self, Command, CtlServer, Daemon};
//!
//! let (conf, _) = NodeConf::from_yaml(
//!     "net:\n    - net type: tcp\n      local NI(s):\n        - nid: 127.0.22.1@tcp\n\
//!      global:\n    accept_port: 0\n",
//! )?;
//! let daemon = Daemon::start(&conf)?;
//! let path = std::env::temp_dir().join(format!("ctl-doc-{}.sock", std::process::id()));
//! let server = CtlServer::start(daemon.clone(), &path)?;
//! let show = Command::NetShow { net: Some("tcp".into()), verbose: false, detail: 0 };
//! let doc = ctl::call(&path, &show, Duration::from_secs(10), |_| {})?;
//! assert!(doc.to_yaml().contains("        - nid: 127.0.22.1@tcp\n          status: up\n"));
//! drop(server);
//! daemon.shutdown();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod daemon;
mod selftest;

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

pub use self::daemon::Daemon;
pub use self::selftest::{
    MAX_BRW, MAX_CONCURRENCY, MAX_DURATION_S, SELFTEST_PORTAL, SelftestKind, SelftestSpec,
};
use crate::yaml::Doc;

/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u32 = 1;
/// The largest frame (an imported configuration travels in one).
pub const MAX_FRAME: usize = 4 << 20;
/// How long the server waits for a client's request.
pub const REQUEST_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once; more are refused with `EBUSY`.
pub const MAX_CLIENTS: usize = 16;

const TARGET: &str = "colibri_lnet_rt::ctl";

/// Errno values used by the control protocol.
pub mod errno {
    /// No such file or directory.
    pub const ENOENT: i32 = 2;
    /// I/O error.
    pub const EIO: i32 = 5;
    /// Device or resource busy.
    pub const EBUSY: i32 = 16;
    /// File exists.
    pub const EEXIST: i32 = 17;
    /// No such device (an interface `net add --if` names).
    pub const ENODEV: i32 = 19;
    /// Argument list too long.
    pub const E2BIG: i32 = 7;
    /// Invalid argument.
    pub const EINVAL: i32 = 22;
    /// Protocol error.
    pub const EPROTO: i32 = 71;
    /// Operation not supported.
    pub const EOPNOTSUPP: i32 = 95;
    /// Connection refused.
    pub const ECONNREFUSED: i32 = 111;
    /// Connection timed out.
    pub const ETIMEDOUT: i32 = 110;
    /// Network is down (LNet unconfigured: "LNet stack down").
    pub const ENETDOWN: i32 = 100;
    /// Host unreachable.
    pub const EHOSTUNREACH: i32 = 113;
    /// Operation already in progress (`udsp add` of a rule that is there).
    pub const EALREADY: i32 = 114;
}

/// A request: the protocol version and the command.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Request {
    /// [`PROTOCOL_VERSION`] of the sender.
    pub version: u32,
    /// What to do.
    pub cmd: Command,
}

/// Fault rule kinds (`lctl net_drop_*`, `net_delay_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// Drop rules.
    Drop,
    /// Delay rules.
    Delay,
}

/// A fault rule as given on the command line.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct FaultArgs {
    /// `--source NID` (`*` = any).
    pub source: Option<String>,
    /// `--dest NID` (`*` = any).
    pub dest: Option<String>,
    /// `--local NID`: the receiving NI of a router.
    pub local: Option<String>,
    /// `--rate N`: one message in N.
    pub rate: Option<u32>,
    /// `--interval S`: one message per S seconds.
    pub interval: Option<u64>,
    /// `--portal P` (repeatable).
    pub portals: Vec<u32>,
    /// `--message put|ack|get|reply` (repeatable).
    pub messages: Vec<String>,
    /// `--latency S` (delay rules).
    pub latency: Option<u64>,
    /// `--health_error NAME` (drop rules; repeatable): simulate the error
    /// on send instead of a silent drop on receive.
    pub health_errors: Vec<String>,
}

/// The commands, named after `lnetctl`'s.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Command {
    /// `net add --nid NID [--credits N] [--peer-credits N]`.
    NetAdd {
        /// The NI's NID (or `net` with `interfaces`).
        #[serde(default)]
        nid: Option<String>,
        /// The net of NIs made from interfaces (`--net tcp --if eth0`).
        #[serde(default)]
        net: Option<String>,
        /// Interface names, comma separated: an NI on each, its NID the
        /// interface's IPv4 address on `net` (none: the first interface
        /// that is up and not a loopback, as socklnd picks).
        #[serde(default)]
        interfaces: Option<String>,
        /// Rules in the `ip2nets` module parameter's form (`tcp(eth0)
        /// 10.0.0.*; tcp1 192.168.*.*`): an NI on each interface they
        /// choose.
        #[serde(default)]
        ip2net: Option<String>,
        /// NI credits.
        credits: Option<u32>,
        /// Per-peer credits.
        peer_credits: Option<u32>,
        /// Per-peer router credits (0 = `peer_credits`).
        #[serde(default)]
        peer_buffer_credits: Option<u32>,
        /// The socket LND's `conns_per_peer` for this NI.
        #[serde(default)]
        conns_per_peer: Option<u32>,
        /// The IP type of service of this NI's connections (-1: the
        /// LND's `tos`).
        #[serde(default)]
        tos: Option<i64>,
        /// The net's `peer_timeout` (-1: 180; 0: no peer aliveness).
        #[serde(default)]
        peer_timeout: Option<i64>,
    },
    /// `net del --nid NID | --net NET`.
    NetDel {
        /// One NI.
        nid: Option<String>,
        /// Every NI of a net.
        net: Option<String>,
        /// With `net`: only its NIs on these interfaces (comma separated).
        #[serde(default)]
        interfaces: Option<String>,
    },
    /// `net set --nid NID | --all [--health V] [--conns-per-peer N]`: a
    /// local NI's health value set by hand (above 1000: 1000), its socket
    /// LND connections per peer for peers met from now on; `net set --net
    /// NET --lnd-timeout S`: the timeout of the LND serving `NET`.
    NetSet {
        /// One NI.
        nid: Option<String>,
        /// Every local NI.
        #[serde(default)]
        all: bool,
        /// The health value.
        health: Option<i64>,
        /// Connections per peer (0: the default; negative: ignored, as
        /// lnetctl ignores it).
        #[serde(default)]
        conns_per_peer: Option<i64>,
        /// The net whose LND `lnd_timeout` is for.
        #[serde(default)]
        net: Option<String>,
        /// The LND timeout, seconds (0: LNet's `lnd_timeout`).
        #[serde(default)]
        lnd_timeout: Option<i64>,
    },
    /// `net show [--net NET] [--verbose]`.
    NetShow {
        /// Only this net.
        net: Option<String>,
        /// Statistics, health, tunables.
        verbose: bool,
        /// `--verbose N`: 2 and more add the counts by message type
        /// (`sent_stats`, `received_stats`, `dropped_stats`).
        #[serde(default)]
        detail: u32,
    },
    /// `peer add --prim_nid NID [--nid NID,...] [--non_mr]`.
    PeerAdd {
        /// Primary NID.
        prim_nid: String,
        /// Other NIDs.
        nids: Vec<String>,
        /// Not Multi-Rail.
        non_mr: bool,
        /// Lock the primary NID (`--lock_prim`).
        #[serde(default)]
        lock_prim: bool,
    },
    /// `peer del --prim_nid NID [--nid NID,...]`.
    PeerDel {
        /// Primary NID.
        prim_nid: String,
        /// NIDs to remove (none: the whole peer).
        nids: Vec<String>,
        /// Unlock a locked primary NID first (`--force`).
        #[serde(default)]
        force: bool,
    },
    /// `peer show [--nid NID] [--verbose]`.
    PeerShow {
        /// Only the peer owning this NID.
        nid: Option<String>,
        /// Credits, statistics, health.
        verbose: bool,
        /// `--verbose N`: 2 and more add the counts by message type.
        #[serde(default)]
        detail: u32,
    },
    /// `peer set --nid NID | --all --health V`: a peer NI's health value
    /// set by hand (above 1000: 1000); `peer set --nid NID --state BITS`:
    /// the flags of the peer owning NID, as Lustre's `lp_state` bits (for
    /// tests and debugging).
    PeerSet {
        /// One peer NI.
        nid: Option<String>,
        /// Every peer NI.
        #[serde(default)]
        all: bool,
        /// The health value.
        health: Option<i64>,
        /// Lustre's peer state bits.
        #[serde(default)]
        state: Option<i64>,
    },
    /// `peer list`.
    PeerList,
    /// `route add --net NET --gateway NID [--hop N] [--priority N]`.
    RouteAdd {
        /// Remote net.
        net: String,
        /// Gateway.
        gateway: String,
        /// Hops (-1 or none: undefined).
        hop: Option<i64>,
        /// Priority (0 = highest).
        priority: Option<u32>,
    },
    /// `route del --net NET --gateway NID`.
    RouteDel {
        /// Remote net.
        net: String,
        /// Gateway.
        gateway: String,
    },
    /// `route show [--net] [--gateway] [--verbose]`.
    RouteShow {
        /// Only routes to this net.
        net: Option<String>,
        /// Only through this gateway.
        gateway: Option<String>,
        /// Hop, priority, state.
        verbose: bool,
    },
    /// `routing show`.
    RoutingShow,
    /// `set NAME VALUE`.
    Set {
        /// `routing`, `discovery`, `retry_count`, ….
        name: String,
        /// The value.
        value: String,
    },
    /// `global show`.
    GlobalShow,
    /// `debug recovery --local|--peer`: the interfaces in recovery.
    DebugRecovery {
        /// The peer NIs' queue instead of the local NIs'.
        peer: bool,
    },
    /// `debug peer --nid NID`: one peer NI's credits and aliveness.
    DebugPeer {
        /// The peer NI.
        nid: String,
    },
    /// `lnet configure [--all]`: LNet up again after `lnet unconfigure`
    /// (with `0@lo` only); with `--all`, the node's startup configuration
    /// applied again.
    LnetConfigure {
        /// The startup configuration (Lustre: the module parameters).
        #[serde(default)]
        all: bool,
    },
    /// `lnet unconfigure`: every NI, route, peer, policy and rule gone
    /// (globals stay, as Lustre's module parameters); until `lnet
    /// configure`, every other command fails with `ENETDOWN` ("LNet stack
    /// down"), as Lustre's do.
    LnetUnconfigure,
    /// `udsp add --src|--dst|--rte EXPR [--priority N] [--idx N]`.
    UdspAdd {
        /// Our interfaces the rule names.
        #[serde(default)]
        src: Option<String>,
        /// The peer interfaces it names.
        #[serde(default)]
        dst: Option<String>,
        /// The gateways it names.
        #[serde(default)]
        rte: Option<String>,
        /// Priority (0 best); none for a NID pair or router rule.
        #[serde(default)]
        priority: Option<i64>,
        /// Where in the list (none: the end).
        #[serde(default)]
        idx: Option<i64>,
    },
    /// `udsp del --idx N | --all`.
    UdspDel {
        /// The rule's index.
        #[serde(default)]
        idx: Option<i64>,
        /// Every rule.
        #[serde(default)]
        all: bool,
    },
    /// `udsp show [--idx N]`.
    UdspShow {
        /// Only this rule.
        #[serde(default)]
        idx: Option<i64>,
    },
    /// `stats show`.
    StatsShow,
    /// `stats reset`.
    StatsReset,
    /// `ping NID[,NID] [--timeout S] [--source NID]`.
    Ping {
        /// Targets.
        nids: Vec<String>,
        /// Per-target timeout in milliseconds.
        timeout_ms: u64,
        /// Source NID (must be local).
        source: Option<String>,
    },
    /// `discover NID[,NID] [--force]`.
    Discover {
        /// Targets.
        nids: Vec<String>,
        /// Restart discovery of known peers.
        force: bool,
        /// How long to wait for the result, in milliseconds.
        timeout_ms: u64,
    },
    /// `export`: the configuration as YAML.
    Export,
    /// `import`: a configuration (YAML text) added to the node, or with
    /// `del` (`import --del`) taken from it.
    Import {
        /// The file's text.
        yaml: String,
        /// Delete what the file describes instead of adding it.
        #[serde(default)]
        del: bool,
    },
    /// `fault drop|delay add`.
    FaultAdd {
        /// Drop or delay.
        kind: FaultKind,
        /// The rule.
        rule: FaultArgs,
    },
    /// `fault drop|delay del (--source/--dest | --all)`.
    FaultDel {
        /// Drop or delay.
        kind: FaultKind,
        /// Rules from this source (`*`: any).
        source: Option<String>,
        /// Rules to this destination (`*`: any).
        dest: Option<String>,
        /// Every rule of the kind.
        all: bool,
    },
    /// `fault drop|delay reset`: statistics zeroed, triggers re-drawn.
    FaultReset {
        /// Drop or delay.
        kind: FaultKind,
    },
    /// `fault drop|delay show`.
    FaultShow {
        /// Only this kind.
        kind: Option<FaultKind>,
    },
    /// `selftest ping|brw`.
    Selftest(SelftestSpec),
}

impl Command {
    /// The operation and object an `lnetctl` error block names for this
    /// command (`show` and `net` for `net show`).
    #[must_use]
    pub const fn names(&self) -> (&'static str, &'static str) {
        match self {
            Self::NetAdd { .. } => ("add", "net"),
            Self::NetDel { .. } => ("del", "net"),
            Self::NetSet { .. } => ("set", "net"),
            Self::NetShow { .. } => ("show", "net"),
            Self::PeerAdd { .. } => ("add", "peer"),
            Self::PeerDel { .. } => ("del", "peer"),
            Self::PeerShow { .. } | Self::DebugPeer { .. } => ("show", "peer"),
            Self::PeerSet { .. } => ("set", "peer"),
            Self::PeerList => ("list", "peer"),
            Self::RouteAdd { .. } => ("add", "route"),
            Self::RouteDel { .. } => ("del", "route"),
            Self::RouteShow { .. } => ("show", "route"),
            Self::RoutingShow => ("show", "routing"),
            Self::Set { .. } => ("set", "global"),
            Self::GlobalShow => ("show", "global"),
            Self::DebugRecovery { .. } => ("show", "recovery"),
            Self::LnetConfigure { .. } => ("configure", "lnet"),
            Self::LnetUnconfigure => ("unconfigure", "lnet"),
            Self::UdspAdd { .. } => ("add", "udsp"),
            Self::UdspDel { .. } => ("del", "udsp"),
            Self::UdspShow { .. } => ("show", "udsp"),
            Self::StatsShow => ("show", "statistics"),
            Self::StatsReset => ("reset", "statistics"),
            Self::Ping { .. } => ("manage", "ping"),
            Self::Discover { .. } => ("manage", "discover"),
            Self::Export => ("export", "config"),
            Self::Import { .. } => ("import", "config"),
            Self::FaultAdd { .. } => ("add", "fault"),
            Self::FaultDel { .. } => ("del", "fault"),
            Self::FaultReset { .. } => ("reset", "fault"),
            Self::FaultShow { .. } => ("show", "fault"),
            Self::Selftest(_) => ("run", "selftest"),
        }
    }

    /// How long a client waits for the whole answer.
    #[must_use]
    pub fn deadline(&self, base: Duration) -> Duration {
        match self {
            Self::Ping {
                nids, timeout_ms, ..
            } => base + Duration::from_millis(*timeout_ms) * u32::try_from(nids.len()).unwrap_or(1),
            Self::Discover {
                nids, timeout_ms, ..
            } => base + Duration::from_millis(*timeout_ms) * u32::try_from(nids.len()).unwrap_or(1),
            Self::Selftest(s) => base + Duration::from_secs(u64::from(s.duration_s) * 2 + 30),
            _ => base,
        }
    }
}

/// The commands of an `lnetctl import --exec` file: its `ping:` and
/// `discover:` blocks (a mapping, or a sequence of them, as lnetctl's
/// netlink form writes them), each with `nids:` (a mapping `0: NID`, ...
/// or a sequence; NID lists with ranges as on the command line),
/// `timeout:` in milliseconds (1000 when absent, as lnetctl's) and, for
/// `ping`, `source:`. Anything else in the file is refused, as lnetctl
/// refuses configuration blocks with `--exec`.
///
/// # Errors
/// Malformed YAML, a block without NIDs, a bad timeout, another key.
pub fn exec_commands(yaml: &str) -> Result<Vec<Command>, Failure> {
    let bad = |what: String| Failure::new("import", "exec", errno::EINVAL, what);
    let doc = Doc::from_yaml(yaml).map_err(|e| bad(e.to_string()))?;
    let Doc::Map(blocks) = doc else {
        return Err(bad("expected `ping:` or `discover:` blocks".into()));
    };
    let mut out = Vec::new();
    for (key, value) in blocks {
        if key != "ping" && key != "discover" {
            return Err(bad(format!(
                "invalid key '{key}': --exec runs `ping` and `discover` only"
            )));
        }
        let each: Vec<&Doc> = match &value {
            Doc::Seq(v) => v.iter().collect(),
            other => vec![other],
        };
        for b in each {
            let nids: Vec<String> = match b.get("nids") {
                Some(Doc::Map(m)) => m.iter().filter_map(|(_, v)| v.as_text()).collect(),
                Some(Doc::Seq(v)) => v.iter().filter_map(Doc::as_text).collect(),
                Some(one) => one.as_text().into_iter().collect(),
                None => Vec::new(),
            };
            if nids.is_empty() {
                return Err(bad(format!("{key}: no value for key 'nids'")));
            }
            let timeout_ms = match b.get("timeout") {
                None => 1000,
                Some(t) => t
                    .as_i64()
                    .and_then(|t| u64::try_from(t).ok())
                    .filter(|t| *t > 0)
                    .ok_or_else(|| bad(format!("{key}: invalid value for key 'timeout'")))?,
            };
            out.push(if key == "ping" {
                Command::Ping {
                    nids,
                    timeout_ms,
                    source: b.get("source").and_then(Doc::as_text),
                }
            } else {
                Command::Discover {
                    nids,
                    force: false,
                    timeout_ms,
                }
            });
        }
    }
    Ok(out)
}

/// A failed command, as `lnetctl` reports it: `op` and `object` name the
/// YAML block (`add:` / `- route:`), `errno` is positive here and printed
/// negated as `lnetctl` does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{descr}")]
pub struct Failure {
    /// The operation (`add`, `del`, `show`, `manage`, `import`, …).
    pub op: String,
    /// The object (`net`, `peer`, `route`, …).
    pub object: String,
    /// Positive errno.
    pub errno: i32,
    /// One line saying what went wrong.
    pub descr: String,
}

impl Failure {
    /// A failure.
    #[must_use]
    pub fn new(op: &str, object: &str, errno: i32, descr: impl Into<String>) -> Self {
        let descr: String = descr.into();
        Self {
            op: op.to_owned(),
            object: object.to_owned(),
            errno,
            descr: descr.replace('\n', " "),
        }
    }

    /// `lnetctl`'s error block:
    ///
    /// ```yaml
    /// add:
    ///     - route:
    ///           errno: -22
    ///           descr: "..."
    /// ```
    #[must_use]
    pub fn to_doc(&self) -> Doc {
        Doc::map().with(
            &self.op,
            vec![
                Doc::map().with(
                    &self.object,
                    Doc::map()
                        .with("errno", -i64::from(self.errno))
                        .with("descr", self.descr.as_str()),
                ),
            ],
        )
    }
}

/// One reply frame.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Reply {
    /// [`PROTOCOL_VERSION`] of the node.
    pub version: u32,
    /// More frames follow (partial results).
    pub more: bool,
    /// The result.
    pub result: Result<Doc, Failure>,
}

fn io_failure(path: &Path, e: &std::io::Error, what: &str) -> Failure {
    use std::io::ErrorKind as K;
    let (errno, descr) = match e.kind() {
        K::NotFound => (
            errno::ENOENT,
            format!(
                "no control socket at {}: is the node running? (start it with 'colibri lnet run --config FILE')",
                path.display()
            ),
        ),
        K::ConnectionRefused => (
            errno::ECONNREFUSED,
            format!(
                "node not running: nothing listens on {} (a stale socket of a node that stopped)",
                path.display()
            ),
        ),
        K::TimedOut | K::WouldBlock => (
            errno::ETIMEDOUT,
            format!(
                "{what}: no answer from the node at {} in time",
                path.display()
            ),
        ),
        K::PermissionDenied => (
            e.raw_os_error().unwrap_or(13),
            format!(
                "{what}: permission denied on {} (the socket belongs to the node's owner)",
                path.display()
            ),
        ),
        _ => (
            e.raw_os_error().unwrap_or(errno::EIO),
            format!("{what} {}: {e}", path.display()),
        ),
    };
    Failure::new("manage", "ctl", errno, descr)
}

fn write_frame(w: &mut impl Write, value: &impl Serialize) -> std::io::Result<()> {
    let body = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    if body.len() > MAX_FRAME {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("message of {} bytes exceeds {MAX_FRAME}", body.len()),
        ));
    }
    let len = u32::try_from(body.len()).unwrap_or(u32::MAX);
    let mut buf = Vec::with_capacity(4 + body.len());
    buf.extend_from_slice(&len.to_be_bytes());
    buf.extend_from_slice(&body);
    w.write_all(&buf)?;
    w.flush()
}

/// Reads one frame: `Ok(None)` at a clean end of stream.
fn read_frame(r: &mut impl Read) -> std::io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("frame of {len} bytes exceeds {MAX_FRAME}"),
        ));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    Ok(Some(body))
}

/// Sends `cmd` to the node at `path` and returns its answer, giving
/// partial answers to `partial` as they come. The whole exchange ends by
/// `timeout` (a node that does not answer gives `ETIMEDOUT`).
///
/// # Errors
/// The node's [`Failure`], or one for a missing socket (`ENOENT`), a node
/// that is not running (`ECONNREFUSED`), a timeout, a protocol mismatch.
pub fn call(
    path: &Path,
    cmd: &Command,
    timeout: Duration,
    mut partial: impl FnMut(&Doc),
) -> Result<Doc, Failure> {
    let deadline = Instant::now() + timeout;
    let mut s = UnixStream::connect(path).map_err(|e| io_failure(path, &e, "connecting to"))?;
    let left = |what| {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| {
                io_failure(
                    path,
                    &std::io::Error::from(std::io::ErrorKind::TimedOut),
                    what,
                )
            })
    };
    s.set_write_timeout(Some(left("sending")?))
        .map_err(|e| io_failure(path, &e, "sending to"))?;
    write_frame(
        &mut s,
        &Request {
            version: PROTOCOL_VERSION,
            cmd: cmd.clone(),
        },
    )
    .map_err(|e| io_failure(path, &e, "sending to"))?;
    loop {
        s.set_read_timeout(Some(left("waiting for")?))
            .map_err(|e| io_failure(path, &e, "reading from"))?;
        let body = match read_frame(&mut s) {
            Ok(Some(b)) => b,
            Ok(None) => {
                return Err(Failure::new(
                    "manage",
                    "ctl",
                    errno::EPROTO,
                    format!(
                        "the node at {} closed the connection without an answer",
                        path.display()
                    ),
                ));
            }
            Err(e) => return Err(io_failure(path, &e, "waiting for")),
        };
        let reply: Reply = serde_json::from_slice(&body).map_err(|e| {
            Failure::new(
                "manage",
                "ctl",
                errno::EPROTO,
                format!("malformed answer from {}: {e}", path.display()),
            )
        })?;
        if reply.version != PROTOCOL_VERSION {
            return Err(Failure::new(
                "manage",
                "ctl",
                errno::EPROTO,
                format!(
                    "the node speaks control protocol version {}, this program {PROTOCOL_VERSION}",
                    reply.version
                ),
            ));
        }
        match (reply.more, reply.result) {
            (true, Ok(doc)) => partial(&doc),
            (_, r) => return r,
        }
    }
}

/// The directory of default control sockets: `$COLIBRI_LNET_CTL_DIR`,
/// else `$XDG_RUNTIME_DIR`, else `/tmp`.
#[must_use]
pub fn default_dir() -> PathBuf {
    for var in ["COLIBRI_LNET_CTL_DIR", "XDG_RUNTIME_DIR"] {
        if let Some(d) = std::env::var_os(var).filter(|d| !d.is_empty()) {
            return PathBuf::from(d);
        }
    }
    PathBuf::from("/tmp")
}

/// The default control socket of a node whose primary NID is `nid`:
/// `DIR/colibri-lnet-<nid>.sock`.
#[must_use]
pub fn default_path(nid: &str) -> PathBuf {
    default_dir().join(format!("colibri-lnet-{nid}.sock"))
}

/// The control socket a client uses without `--ctl`:
/// `$COLIBRI_LNET_CTL`, else the only `colibri-lnet-*.sock` in
/// [`default_dir`].
///
/// # Errors
/// None or several sockets there.
pub fn find_default() -> Result<PathBuf, Failure> {
    if let Some(p) = std::env::var_os("COLIBRI_LNET_CTL").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let dir = default_dir();
    let mut found: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("colibri-lnet-") && n.ends_with(".sock"))
                })
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(Failure::new(
            "manage",
            "ctl",
            errno::ENOENT,
            format!(
                "no control socket in {}: is a node running? (start one with 'colibri lnet run --config FILE', or name its socket with --ctl)",
                dir.display()
            ),
        )),
        _ => Err(Failure::new(
            "manage",
            "ctl",
            errno::EINVAL,
            format!(
                "several nodes run here ({}): choose one with --ctl",
                found
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
    }
}

/// The listening side: an accept thread and one thread per connection
/// (at most [`MAX_CLIENTS`]). Dropping it (or [`CtlServer::stop`]) stops
/// accepting and removes the socket file.
#[derive(Debug)]
pub struct CtlServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// Closed when the accept thread ends.
    exited: crossbeam_channel::Receiver<()>,
    /// The socket file's identity (device, inode): removed at stop only if
    /// it is still ours.
    file_id: Option<(u64, u64)>,
}

fn file_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

impl CtlServer {
    /// Listens on `path` (mode 0600) for commands to `daemon`. A socket
    /// file left by a node that stopped is replaced; one a live node
    /// answers on is not.
    ///
    /// # Errors
    /// `EEXIST` when a live node uses `path`; socket errors.
    pub fn start(daemon: Arc<Daemon>, path: &Path) -> Result<Self, Failure> {
        let fail = |e: &std::io::Error, what: &str| {
            Failure::new(
                "manage",
                "ctl",
                e.raw_os_error().unwrap_or(errno::EIO),
                format!("{what} {}: {e}", path.display()),
            )
        };
        if path.exists() {
            if UnixStream::connect(path).is_ok() {
                return Err(Failure::new(
                    "manage",
                    "ctl",
                    errno::EEXIST,
                    format!(
                        "control socket {} is in use by a running node",
                        path.display()
                    ),
                ));
            }
            std::fs::remove_file(path).map_err(|e| fail(&e, "removing stale socket"))?;
        }
        // Bound under a temporary name, made 0600, then renamed: nobody
        // can connect to the final path before its mode is set.
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        let listener = UnixListener::bind(&tmp).map_err(|e| fail(&e, "binding"))?;
        let setup = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
            .and_then(|()| std::fs::rename(&tmp, path));
        if let Err(e) = setup {
            let _ = std::fs::remove_file(&tmp);
            return Err(fail(&e, "setting up"));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let (exited_tx, exited) = crossbeam_channel::bounded::<()>(1);
        let thread = std::thread::Builder::new()
            .name("lnet-ctl".into())
            .spawn(move || {
                accept_loop(&listener, &daemon, &st);
                drop(exited_tx);
            })
            .map_err(|e| fail(&e, "spawning the control thread for"))?;
        tracing::info!(target: TARGET, path = %path.display(), "control socket listening");
        Ok(Self {
            path: path.to_owned(),
            stop,
            thread: Some(thread),
            exited,
            file_id: file_id(path),
        })
    }

    /// The socket's path.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stops accepting (connections being served finish) and removes the
    /// socket file. Idempotent.
    pub fn stop(&mut self) {
        if self.stop.swap(true, Ordering::AcqRel) {
            return;
        }
        // Wake the accept call. Should the path no longer lead to our
        // socket (removed or replaced by someone), the accept thread is
        // left blocked rather than waited for forever.
        let _ = UnixStream::connect(&self.path);
        if let Some(t) = self.thread.take() {
            match self.exited.recv_timeout(Duration::from_secs(2)) {
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                    let _ = t.join();
                }
                _ => tracing::warn!(
                    target: TARGET,
                    path = %self.path.display(),
                    "control socket path no longer ours; accept thread left behind"
                ),
            }
        }
        if self.file_id.is_some() && file_id(&self.path) == self.file_id {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Drop for CtlServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_loop(listener: &UnixListener, daemon: &Arc<Daemon>, stop: &AtomicBool) {
    let active = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        if stop.load(Ordering::Acquire) {
            break;
        }
        let mut s = match conn {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(target: TARGET, error = %e, "accept on the control socket");
                continue;
            }
        };
        if active.fetch_add(1, Ordering::AcqRel) >= MAX_CLIENTS {
            active.fetch_sub(1, Ordering::AcqRel);
            let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
            let _ = write_frame(
                &mut s,
                &Reply {
                    version: PROTOCOL_VERSION,
                    more: false,
                    result: Err(Failure::new(
                        "manage",
                        "ctl",
                        errno::EBUSY,
                        format!("the node serves {MAX_CLIENTS} control connections already"),
                    )),
                },
            );
            continue;
        }
        let (d, a) = (daemon.clone(), active.clone());
        let spawned = std::thread::Builder::new()
            .name("lnet-ctl-conn".into())
            .spawn(move || {
                serve(&d, s);
                a.fetch_sub(1, Ordering::AcqRel);
            });
        if let Err(e) = spawned {
            active.fetch_sub(1, Ordering::AcqRel);
            tracing::warn!(target: TARGET, error = %e, "cannot serve a control connection");
        }
    }
}

fn serve(daemon: &Daemon, mut s: UnixStream) {
    let _ = s.set_read_timeout(Some(REQUEST_READ_TIMEOUT));
    let _ = s.set_write_timeout(Some(REQUEST_READ_TIMEOUT));
    let reply = |s: &mut UnixStream, more: bool, result: Result<Doc, Failure>| {
        write_frame(
            s,
            &Reply {
                version: PROTOCOL_VERSION,
                more,
                result,
            },
        )
    };
    let body = match read_frame(&mut s) {
        Ok(Some(b)) => b,
        Ok(None) => return,
        Err(e) => {
            tracing::debug!(target: TARGET, error = %e, "bad control request");
            let _ = reply(
                &mut s,
                false,
                Err(Failure::new("manage", "ctl", errno::EPROTO, e.to_string())),
            );
            return;
        }
    };
    // The version first, so that a newer client's unknown command is
    // reported as a version mismatch.
    let version = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("version").and_then(serde_json::Value::as_u64));
    if version != Some(u64::from(PROTOCOL_VERSION)) {
        let _ = reply(
            &mut s,
            false,
            Err(Failure::new(
                "manage",
                "ctl",
                errno::EPROTO,
                format!(
                    "control protocol version {} not supported: this node speaks {PROTOCOL_VERSION}",
                    version.map_or_else(|| "missing".to_owned(), |v| v.to_string())
                ),
            )),
        );
        return;
    }
    let req: Request = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            let _ = reply(
                &mut s,
                false,
                Err(Failure::new(
                    "manage",
                    "ctl",
                    errno::EINVAL,
                    format!("malformed request: {e}"),
                )),
            );
            return;
        }
    };
    tracing::debug!(target: TARGET, cmd = ?req.cmd, "control request");
    let mut broken = false;
    let result = daemon.handle(req.cmd, &mut |doc| {
        if !broken && reply(&mut s, true, Ok(doc)).is_err() {
            broken = true;
        }
        !broken
    });
    if let Err(f) = &result {
        tracing::info!(target: TARGET, errno = f.errno, descr = %f.descr, "control request failed");
    }
    let _ = reply(&mut s, false, result);
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::*;

    #[test]
    fn frames_round_trip() {
        let mut buf = Vec::new();
        let req = Request {
            version: PROTOCOL_VERSION,
            cmd: Command::PeerList,
        };
        write_frame(&mut buf, &req).unwrap();
        write_frame(&mut buf, &req).unwrap();
        assert_eq!(
            &buf[..4],
            &u32::try_from(buf.len() / 2 - 4).unwrap().to_be_bytes()
        );
        let mut r = Cursor::new(buf);
        for _ in 0..2 {
            let body = read_frame(&mut r).unwrap().unwrap();
            let back: Request = serde_json::from_slice(&body).unwrap();
            assert_eq!(back.version, PROTOCOL_VERSION);
            assert!(matches!(back.cmd, Command::PeerList));
        }
        // A clean end between frames.
        assert!(read_frame(&mut r).unwrap().is_none());
    }

    #[test]
    fn bad_frames_are_errors() {
        // Longer than allowed: refused before reading the body.
        let mut big = (u32::try_from(MAX_FRAME).unwrap() + 1)
            .to_be_bytes()
            .to_vec();
        big.extend_from_slice(b"{}");
        let e = read_frame(&mut Cursor::new(big)).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        // Cut in the middle of the body.
        let mut cut = 10u32.to_be_bytes().to_vec();
        cut.extend_from_slice(b"{\"a\"");
        let e = read_frame(&mut Cursor::new(cut)).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
        // Cut in the length: a clean end (nothing to answer).
        assert!(
            read_frame(&mut Cursor::new(vec![0u8, 0]))
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn failures_print_as_lnetctl_does() {
        let f = Failure::new(
            "add",
            "route",
            errno::EEXIST,
            "route to tcp: tcp is a local net\nmore",
        );
        assert_eq!(
            f.to_doc().to_yaml(),
            "add:\n    - route:\n          errno: -17\n          descr: \"route to tcp: tcp is a local net more\"\n"
        );
    }

    /// `lnetctl import --exec` files (sanity-lnet test 350), in both of
    /// lnetctl's shapes, and what they may not hold.
    #[test]
    fn exec_files_become_pings_and_discoveries() {
        let cmds = exec_commands(
            "ping:\n  nids:\n    0: 10.0.0.1@tcp\n    1: 10.0.0.2@tcp\n  timeout: 2500\n  source: 10.0.0.9@tcp\ndiscover:\n  - nids: [10.0.0.3@tcp]\n",
        )
        .unwrap();
        // `Command` has no `PartialEq`: compared as printed.
        assert_eq!(
            format!("{cmds:?}"),
            format!(
                "{:?}",
                vec![
                    Command::Ping {
                        nids: vec!["10.0.0.1@tcp".into(), "10.0.0.2@tcp".into()],
                        timeout_ms: 2500,
                        source: Some("10.0.0.9@tcp".into()),
                    },
                    Command::Discover {
                        nids: vec!["10.0.0.3@tcp".into()],
                        force: false,
                        timeout_ms: 1000,
                    },
                ]
            )
        );
        for (bad, want) in [
            ("net:\n  - net type: tcp\n", "invalid key 'net'"),
            ("ping:\n  timeout: 5\n", "no value for key 'nids'"),
            ("ping:\n  nids: [a]\n  timeout: -1\n", "'timeout'"),
            ("ping: [\n", "malformed"),
            ("- 1\n", "blocks"),
        ] {
            let e = exec_commands(bad).unwrap_err();
            assert!(e.descr.contains(want), "{bad:?}: {e}");
            assert_eq!(e.errno, errno::EINVAL);
        }
    }

    #[test]
    fn deadlines_cover_long_commands() {
        let base = Duration::from_secs(10);
        assert_eq!(Command::GlobalShow.deadline(base), base);
        let ping = Command::Ping {
            nids: vec!["a".into(), "b".into()],
            timeout_ms: 3000,
            source: None,
        };
        assert_eq!(ping.deadline(base), Duration::from_secs(16));
        let st = Command::Selftest(SelftestSpec {
            kind: SelftestKind::Ping,
            to: vec![],
            duration_s: 5,
            concurrency: 1,
            interval_s: 1,
        });
        assert!(st.deadline(base) > Duration::from_secs(15));
    }
}
