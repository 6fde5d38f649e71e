//! `colibri lnet`: run an LNet node as a process (`run`) and configure and
//! measure a running one through its control socket, with `lnetctl`'s
//! command names, options and YAML.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use colibri_lnet_rt::conf::NodeConf;
use colibri_lnet_rt::ctl::{
    self, Command, CtlServer, Daemon, Failure, FaultArgs, FaultKind, SelftestKind, SelftestSpec,
    errno,
};
use colibri_lnet_rt::yaml::Doc;

/// Options of `colibri lnet`.
#[derive(Debug, clap::Args)]
pub(crate) struct LnetArgs {
    /// The node's control socket (default: the only
    /// `colibri-lnet-*.sock` in $COLIBRI_LNET_CTL_DIR, $XDG_RUNTIME_DIR or
    /// /tmp; `run` derives it from the primary NID).
    #[arg(long, global = true, value_name = "PATH")]
    ctl: Option<PathBuf>,
    /// JSON instead of YAML (one object per line).
    #[arg(long, global = true)]
    json: bool,
    /// Seconds to wait for the node's answer (long commands add their own
    /// time).
    #[arg(
        long = "ctl-timeout",
        global = true,
        default_value_t = 10,
        value_name = "SECS"
    )]
    ctl_timeout: u64,
    #[command(subcommand)]
    cmd: LnetCmd,
}

impl LnetArgs {
    /// Whether this is `run` (which logs at info level).
    pub(crate) const fn is_run(&self) -> bool {
        matches!(self.cmd, LnetCmd::Run(_))
    }
}

#[derive(Debug, clap::Subcommand)]
enum LnetCmd {
    /// Run one LNet node in the foreground from a YAML file in
    /// `lnetctl export` shape, with a control socket (mode 0600).
    ///
    /// Prints `READY pid=… nids=… ctl=PATH` once it serves, logs through
    /// tracing (RUST_LOG), and stops on SIGINT/SIGTERM with a final
    /// statistics line.
    ///
    /// Example:
    ///   colibri lnet run --config examples/lnet/router.yaml --ctl /tmp/router.sock
    #[command(verbatim_doc_comment)]
    Run(RunArgs),
    /// Local NIs: `net add|del|set|show`.
    #[command(subcommand)]
    Net(NetCmd),
    /// Peers: `peer add|del|set|show|list`.
    #[command(subcommand)]
    Peer(PeerCmd),
    /// Routes: `route add|del|show`.
    #[command(subcommand)]
    Route(RouteCmd),
    /// Selection policies (Lustre's UDSP): `udsp add|del|show`.
    #[command(subcommand)]
    Udsp(UdspCmd),
    /// `lnet unconfigure` (everything configured goes, the node keeps
    /// running with 0@lo) and `lnet configure [--all]` (`--all`: its
    /// startup configuration again), as lnetctl's.
    #[command(subcommand)]
    Lnet(LnetUpDown),
    /// Router buffer pools and whether the node routes.
    #[command(subcommand)]
    Routing(ShowOnly),
    /// `set NAME VALUE`: routing, tiny_buffers, small_buffers, large_buffers
    /// and lnetctl's globals (discovery, retry_count, transaction_timeout,
    /// health_sensitivity, drop_asym_route, response_tracking,
    /// recovery_limit, max_recovery_ping_interval, max_interfaces), plus
    /// the router checker's module parameters alive_router_check_interval,
    /// router_ping_timeout, avoid_asym_router_failure and
    /// check_routers_before_use.
    ///
    /// numa_range (no NUMA here), recovery_interval and router_sensitivity
    /// (deprecated in Lustre) are kept and shown but change nothing: a
    /// warning says so.
    Set {
        /// The setting.
        name: String,
        /// Its new value.
        value: String,
    },
    /// Global settings.
    #[command(subcommand)]
    Global(ShowOnly),
    /// `debug recovery --local|--peer`: the interfaces in recovery;
    /// `debug peer --nid NID`: a peer NI's credits.
    #[command(subcommand)]
    Debug(DebugCmd),
    /// LNet counters: `stats show|reset`.
    #[command(subcommand)]
    Stats(StatsCmd),
    /// Ping NIDs (LNet ping: the peer's interfaces).
    Ping {
        /// NID[,NID…].
        nids: String,
        /// Seconds to wait for each reply.
        #[arg(long, default_value_t = 1)]
        timeout: u64,
        /// A local NID to ping from.
        #[arg(long)]
        source: Option<String>,
    },
    /// Discover peers (their NIDs, Multi-Rail).
    Discover {
        /// NID[,NID…].
        nids: String,
        /// Discover again even if known.
        #[arg(long)]
        force: bool,
        /// Seconds to wait for each peer.
        #[arg(long, default_value_t = 10)]
        timeout: u64,
    },
    /// Write the node's configuration (YAML) to FILE or standard output.
    Export {
        /// Output file.
        file: Option<PathBuf>,
        /// lnetctl's `--backup`: the configuration only, no state or
        /// statistics (what this export always writes).
        #[arg(short = 'b', long)]
        backup: bool,
    },
    /// Add a configuration (YAML, `lnetctl export` shape) to the node, or
    /// take it away (`--del`).
    Import {
        /// Input file (standard input when absent or `-`).
        file: Option<PathBuf>,
        /// Add what the file describes (the default).
        #[arg(short = 'a', long, conflicts_with = "del")]
        add: bool,
        /// Delete what the file describes: its NIs, peers (whole when the
        /// primary NID is listed among its NIs, else the NIs listed),
        /// routes; routing off; the globals it names back to their
        /// defaults.
        #[arg(short = 'd', long)]
        del: bool,
        /// Run the file's `ping:` and `discover:` blocks (`nids:`, and
        /// `timeout:` in milliseconds, `source:`), as `lnetctl import
        /// --exec`.
        #[arg(short = 'e', long, conflicts_with_all = ["add", "del"])]
        exec: bool,
        /// lnetctl's "do not use netlink" (for its tests): accepted, no
        /// effect (there is one control protocol here).
        #[arg(short = 'o', long = "old-api")]
        old_api: bool,
    },
    /// Fault injection rules (`lctl net_drop_*`, `net_delay_*`).
    #[command(subcommand)]
    Fault(FaultCmd),
    /// Measure LNet between nodes, in the spirit of `lst`.
    #[command(subcommand)]
    Selftest(SelftestCmd),
    /// Convert LNet's legacy module parameters (`networks=`, `ip2nets=`,
    /// `routes=`) into YAML for `import`, as Lustre's `lnet_legacy2yaml`.
    /// No node is needed.
    ///
    /// Sources, read in this order: `--modprobe` files (their `options
    /// lnet ...` lines), `--ip2nets`, `--routes`, `--networks` files, then
    /// the inline text or, without one and without files, standard input
    /// when it is not a terminal. The inline text is assignments
    /// (`options lnet 'ip2nets="tcp0 10.0.0.*" routes="..."'`,
    /// `networks=tcp0(eth0)`) or, with none, `ip2nets` rules. Routes are
    /// `NET [HOPS] GATEWAY[:PRIORITY]` or `NET: { gateway: GW, hop: H,
    /// priority: P }`.
    ///
    /// Exit status: 0 converted, 1 nothing to convert, 2 a source that
    /// does not read or convert (the message says which entry and why).
    ///
    /// Example:
    ///   colibri lnet legacy2yaml -m /etc/modprobe.d/lustre.conf -o lnet.yaml
    #[command(verbatim_doc_comment)]
    Legacy2yaml(Legacy2yamlArgs),
}

/// `legacy2yaml`.
#[derive(Debug, clap::Args)]
struct Legacy2yamlArgs {
    /// An inline legacy string or `options lnet ...` line.
    inline: Option<String>,
    /// A file of `ip2nets` rules (separated by `;` or new lines); may be
    /// repeated.
    #[arg(short = 'i', long = "ip2nets", value_name = "FILE")]
    ip2nets: Vec<PathBuf>,
    /// A file of routes (separated by `;` or new lines); may be repeated.
    #[arg(short = 'r', long = "routes", value_name = "FILE")]
    routes: Vec<PathBuf>,
    /// A file of `networks` entries (separated by commas or new lines);
    /// may be repeated.
    #[arg(short = 'n', long = "networks", value_name = "FILE")]
    networks: Vec<PathBuf>,
    /// A modprobe configuration file; may be repeated.
    #[arg(short = 'm', long = "modprobe", value_name = "FILE")]
    modprobe: Vec<PathBuf>,
    /// Write the YAML to FILE instead of standard output.
    #[arg(short = 'o', long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Give routes without a hop count this one (1 to 255; 1 when the
    /// value is left out). Explicit hop counts stay.
    #[arg(long, num_args = 0..=1, default_missing_value = "1", value_name = "HOP")]
    default_hop: Option<u32>,
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// The configuration (YAML, `lnetctl export` shape).
    #[arg(long, value_name = "FILE", required_unless_present_any = ["networks", "ip2nets"])]
    config: Option<PathBuf>,
    /// LNet's `networks` module parameter, added to the configuration:
    /// nets with their interfaces, `tcp0(eth0,eth1),tcp1(eth2)`.
    #[arg(long, value_name = "NETS")]
    networks: Option<String>,
    /// LNet's `ip2nets` module parameter (not with --networks): rules
    /// `NET[(IF,...)] RANGE...` separated by `;`.
    #[arg(long, value_name = "RULES", conflicts_with = "networks")]
    ip2nets: Option<String>,
    /// LNet's `routes` module parameter: `NET [HOPS] GATEWAY[:PRIORITY]
    /// ...` separated by `;`, gateways as NIDs or NID ranges.
    #[arg(long, value_name = "ROUTES")]
    routes: Option<String>,
    /// Also stop when standard input closes (for supervisors and tests).
    #[arg(long)]
    exit_on_eof: bool,
    /// Forward payloads of 32 KiB or more through up to N kernel pipes
    /// (splice), never copying them through user space: about half a
    /// router's CPU time per forwarded byte. For a router with CPUs of
    /// its own: beside its client and server on one machine it slowed
    /// them (lnet_xprt/rt/DESIGN.md). 0 (default): through memory.
    #[arg(long, value_name = "N", default_value_t = 0)]
    splice_pipes: usize,
}

#[derive(Debug, clap::Subcommand)]
enum ShowOnly {
    /// Show.
    Show {
        /// Accepted and ignored, as lnetctl ignores it here (`global show
        /// -v`): everything is shown.
        #[arg(long, short, num_args = 0..=1, default_missing_value = "1", value_name = "LEVEL")]
        verbose: Option<u32>,
    },
}

/// `debug`.
#[derive(Debug, clap::Subcommand)]
enum DebugCmd {
    /// The local NIs (`--local`) or peer NIs (`--peer`) in recovery: health
    /// below the maximum, pinged until they answer (`nid-0`, `nid-1`, ...;
    /// an empty queue is an error, as in Lustre).
    Recovery {
        /// The local NIs.
        #[arg(
            short = 'l',
            long,
            conflicts_with = "peer",
            required_unless_present = "peer"
        )]
        local: bool,
        /// The peer NIs.
        #[arg(short = 'p', long)]
        peer: bool,
    },
    /// One peer NI's aliveness and credits, as Lustre's `lnet_debug_peer`
    /// logs them (also written to the node's log).
    Peer {
        /// The peer NI's NID.
        #[arg(long)]
        nid: String,
    },
}

/// Which interfaces `net set` and `peer set` change.
#[derive(Debug, clap::Args)]
struct SetWhich {
    /// The interface's NID.
    #[arg(long, conflicts_with = "all", required_unless_present = "all")]
    nid: Option<String>,
    /// Every interface of the kind.
    #[arg(long)]
    all: bool,
}

/// `net set`.
#[derive(Debug, clap::Args)]
struct NetSet {
    /// The interface's NID.
    #[arg(
        long,
        conflicts_with = "all",
        required_unless_present_any = ["all", "lnd_timeout"]
    )]
    nid: Option<String>,
    /// Every interface.
    #[arg(long)]
    all: bool,
    /// Health value, 0 to 1000.
    #[arg(
        long,
        allow_negative_numbers = true,
        required_unless_present_any = ["conns_per_peer", "lnd_timeout"]
    )]
    health: Option<i64>,
    /// Socket LND connections (BULK_IN/BULK_OUT pairs) per peer met from
    /// now on, 0 to 127 (0: the default; a negative value is ignored, as
    /// lnetctl ignores it).
    #[arg(
        long = "conns-per-peer",
        alias = "conns_per_peer",
        allow_negative_numbers = true
    )]
    conns_per_peer: Option<i64>,
    /// The net whose LND `--lnd-timeout` sets (e.g. tcp: the socket LND,
    /// for all its nets).
    #[arg(long, requires = "lnd_timeout")]
    net: Option<String>,
    /// The LND's timeout, seconds: a socket connection making no progress
    /// that long is closed (0: LNet's lnd_timeout, from the transaction
    /// timeout and retry count).
    #[arg(
        long = "lnd-timeout",
        alias = "lnd_timeout",
        allow_negative_numbers = true,
        requires = "net"
    )]
    lnd_timeout: Option<i64>,
}

/// `peer set`.
#[derive(Debug, clap::Args)]
struct PeerSet {
    #[command(flatten)]
    which: SetWhich,
    /// Health value, 0 to 1000.
    #[arg(long, allow_negative_numbers = true, required_unless_present = "state")]
    health: Option<i64>,
    /// The peer's flags as Lustre's `lp_state` bits (for tests and
    /// debugging, as lnetctl's): MULTI_RAIL 1, CONFIGURED 8,
    /// LOCK_PRIMARY 1048576 and BAD_CONFIG 2097152 are set; discovery's
    /// own bits follow its progress. Needs --nid.
    #[arg(long, allow_negative_numbers = true)]
    state: Option<i64>,
}

#[derive(Debug, clap::Subcommand)]
enum NetCmd {
    /// Add a local NI (it listens on its IP and the node's accept_port):
    /// `--nid IP@tcpN`, or `--net tcpN --if IFACE[,IFACE...]` (an NI on
    /// each interface, its NID the interface's IPv4 address on the net;
    /// `--net` alone takes the first interface that is up and not a
    /// loopback).
    Add {
        /// The NI's NID (ip@tcpN).
        #[arg(long, conflicts_with_all = ["net", "interfaces"])]
        nid: Option<String>,
        /// The net of NIs made from interfaces.
        #[arg(long)]
        net: Option<String>,
        /// Interface names, comma separated (with --net).
        #[arg(long = "if", requires = "net")]
        interfaces: Option<String>,
        /// Rules in the form of LNet's `ip2nets` module parameter: `NET[(IF,...)]
        /// RANGE...` separated by `;` (`"tcp(eth0) 192.168.0.*"`): an NI on
        /// each interface they choose.
        #[arg(long, conflicts_with_all = ["nid", "net", "interfaces"])]
        ip2net: Option<String>,
        /// CPT binding (`"[0,1]"`): accepted and ignored, with a warning
        /// (one partition here).
        #[arg(long)]
        cpt: Option<String>,
        /// NI credits.
        #[arg(long)]
        credits: Option<u32>,
        /// Per-peer credits.
        #[arg(long = "peer-credits", alias = "peer_credits")]
        peer_credits: Option<u32>,
        /// Per-peer router credits when routing (0 = peer credits).
        #[arg(long = "peer-buffer-credits", alias = "peer_buffer_credits")]
        peer_buffer_credits: Option<u32>,
        /// Socket LND connections per peer (BULK_IN/BULK_OUT pairs), 1..=127.
        #[arg(long = "conns-per-peer", alias = "conns_per_peer")]
        conns_per_peer: Option<u32>,
        /// IP type of service of the NI's connections, 0..=255 (-1: the
        /// socket LND's `tos`).
        #[arg(long, allow_negative_numbers = true)]
        tos: Option<i64>,
        /// The net's peer timeout in seconds (-1: 180, 0: off): above 0, a
        /// router drops what it would forward to a peer NI known dead.
        #[arg(
            long = "peer-timeout",
            alias = "peer_timeout",
            allow_negative_numbers = true
        )]
        peer_timeout: Option<i64>,
    },
    /// Delete a local NI, or every NI of a net (with --if: those on the
    /// interfaces named).
    Del {
        /// One NI.
        #[arg(long)]
        nid: Option<String>,
        /// Every NI of this net.
        #[arg(long)]
        net: Option<String>,
        /// Interface names, comma separated (with --net).
        #[arg(long = "if", requires = "net")]
        interfaces: Option<String>,
    },
    /// Set a local NI's health value by hand (`--all`: every NI), as
    /// `lnetctl net set --health`: below 1000 the NI enters recovery, at 0
    /// it goes down, at 1000 (or more) it is up and healthy; or its
    /// connections per peer (`--conns-per-peer`); or the timeout of the
    /// LND serving a net (`--net tcp --lnd-timeout S`).
    Set(NetSet),
    /// Show local NIs.
    Show {
        /// Only this net.
        #[arg(long)]
        net: Option<String>,
        /// Statistics, health and tunables (`--verbose 2`: also the counts
        /// by message type).
        #[arg(long, short, num_args = 0..=1, default_missing_value = "1", value_name = "LEVEL")]
        verbose: Option<u32>,
    },
}

#[derive(Debug, clap::Subcommand)]
enum PeerCmd {
    /// Add a peer (or NIDs to it).
    Add {
        /// Primary NID.
        #[arg(long = "prim_nid", alias = "prim-nid")]
        prim_nid: String,
        /// Other NIDs (comma-separated).
        #[arg(long)]
        nid: Option<String>,
        /// Not Multi-Rail.
        #[arg(long = "non_mr", alias = "non-mr")]
        non_mr: bool,
        /// Lock the primary NID: discovery keeps it, and deleting the peer
        /// removes only its other NIDs unless `peer del --force`.
        #[arg(long = "lock_prim", alias = "lock-prim")]
        lock_prim: bool,
    },
    /// Delete NIDs of a peer, or the whole peer.
    Del {
        /// Primary NID.
        #[arg(long = "prim_nid", alias = "prim-nid")]
        prim_nid: String,
        /// NIDs to delete (comma-separated; none: the whole peer).
        #[arg(long)]
        nid: Option<String>,
        /// Delete a peer whose primary NID is locked too.
        #[arg(long)]
        force: bool,
    },
    /// Show peers.
    Show {
        /// Only the peer owning this NID.
        #[arg(long)]
        nid: Option<String>,
        /// Credits, statistics, health (`--verbose 2`: also the counts by
        /// message type).
        #[arg(long, short, num_args = 0..=1, default_missing_value = "1", value_name = "LEVEL")]
        verbose: Option<u32>,
    },
    /// Set a peer NI's health value by hand (`--all`: every peer NI), as
    /// `lnetctl peer set --health`: below 1000 it enters recovery (pinged
    /// until healthy again) and selection avoids it meanwhile; or, with
    /// `--state`, a peer's flags (`lnetctl peer set --state`).
    Set(PeerSet),
    /// List the peers' primary NIDs.
    List,
}

#[derive(Debug, clap::Subcommand)]
enum RouteCmd {
    /// Add a route.
    Add {
        /// Remote net.
        #[arg(long)]
        net: String,
        /// Gateway NID (on a local net).
        #[arg(long)]
        gateway: String,
        /// Hops (1..255; -1: undefined).
        #[arg(long, allow_hyphen_values = true)]
        hop: Option<i64>,
        /// Priority (0 is the highest).
        #[arg(long)]
        priority: Option<u32>,
    },
    /// Delete a route.
    Del {
        /// Remote net.
        #[arg(long)]
        net: String,
        /// Gateway NID.
        #[arg(long)]
        gateway: String,
    },
    /// Show routes.
    Show {
        /// Only to this net.
        #[arg(long)]
        net: Option<String>,
        /// Only through this gateway.
        #[arg(long)]
        gateway: Option<String>,
        /// Hop, priority, state.
        #[arg(long, short)]
        verbose: bool,
    },
}

/// `lnet configure|unconfigure`.
#[derive(Debug, clap::Subcommand)]
enum LnetUpDown {
    /// Bring LNet up: nothing to do on a running node, or with `--all`
    /// the configuration it was started with, applied again.
    Configure {
        /// The startup configuration (Lustre: the module parameters).
        #[arg(long)]
        all: bool,
    },
    /// Take LNet down: NIs, routes, peers, selection policies and fault
    /// rules go; routing, buffers, globals and counters back to defaults.
    Unconfigure,
}

/// `udsp`: user defined selection policies.
#[derive(Debug, clap::Subcommand)]
enum UdspCmd {
    /// Add a rule: `--src EXPR --priority P` ranks our nets or NIs,
    /// `--dst EXPR --priority P` peer nets or NIs, `--src A --dst B` makes
    /// peer NIs B prefer our NIs A, `--dst B --rte R` makes them prefer
    /// gateways R. EXPR is a net (`tcp1`, `o2ib[0-3]`) or NIDs
    /// (`10.0.0.[1-9]@tcp`, `*.*.*.*@tcp1`); priority 0 is the best.
    Add {
        /// Our interfaces.
        #[arg(long)]
        src: Option<String>,
        /// Peer interfaces.
        #[arg(long)]
        dst: Option<String>,
        /// Gateways.
        #[arg(long)]
        rte: Option<String>,
        /// Priority, 0 the best.
        #[arg(long, allow_negative_numbers = true)]
        priority: Option<i64>,
        /// Index to insert the rule at (the lowest index that matches an
        /// interface decides); the end by default.
        #[arg(long, allow_negative_numbers = true)]
        idx: Option<i64>,
    },
    /// Delete the rule at `--idx` (the later ones move up), or `--all`.
    Del {
        /// The rule's index.
        #[arg(long, allow_negative_numbers = true)]
        idx: Option<i64>,
        /// Every rule.
        #[arg(long)]
        all: bool,
    },
    /// Show the rules (nothing when there is none).
    Show {
        /// Only this one.
        #[arg(long, allow_negative_numbers = true)]
        idx: Option<i64>,
    },
}

#[derive(Debug, clap::Subcommand)]
enum StatsCmd {
    /// Show the counters.
    Show,
    /// Zero them.
    Reset,
}

#[derive(Debug, clap::Subcommand)]
enum FaultCmd {
    /// Drop rules.
    #[command(subcommand)]
    Drop(FaultOp),
    /// Delay rules.
    #[command(subcommand)]
    Delay(FaultOp),
}

#[derive(Debug, clap::Subcommand)]
enum FaultOp {
    /// Add a rule.
    Add(FaultAddArgs),
    /// Delete rules.
    Del {
        /// Rules from this source (`*`: any).
        #[arg(long, short)]
        source: Option<String>,
        /// Rules to this destination (`*`: any).
        #[arg(long, short)]
        dest: Option<String>,
        /// Every rule.
        #[arg(long, short)]
        all: bool,
    },
    /// Show rules and their statistics.
    Show,
    /// Zero the rules' statistics (and draw their triggers again).
    Reset,
}

#[derive(Debug, clap::Args)]
struct FaultAddArgs {
    /// Source NID (`*`: any; `255.255.255.255@net`: a whole net).
    #[arg(long, short, default_value = "*")]
    source: String,
    /// Destination NID.
    #[arg(long, short, default_value = "*")]
    dest: String,
    /// Receiving NI (routers).
    #[arg(long)]
    local: Option<String>,
    /// One message in RATE.
    #[arg(long, short)]
    rate: Option<u32>,
    /// One message every INTERVAL seconds.
    #[arg(long, short)]
    interval: Option<u64>,
    /// Only PUT/GET on this portal (repeatable).
    #[arg(long, short)]
    portal: Vec<u32>,
    /// Only these message types: put, ack, get, reply (repeatable).
    #[arg(long, short)]
    message: Vec<String>,
    /// Seconds a delayed message is held (delay rules).
    #[arg(long, short)]
    latency: Option<u64>,
    /// Simulate this health error on send instead of dropping on receive
    /// (drop rules; repeatable): local_interrupt, local_dropped,
    /// local_aborted, local_no_route, local_error, local_timeout,
    /// remote_error, remote_dropped, remote_timeout, network_timeout.
    #[arg(long = "health_error", alias = "health-error", short = 'e')]
    health_error: Vec<String>,
}

#[derive(Debug, clap::Subcommand)]
enum SelftestCmd {
    /// LNet pings from this node to the --to nodes.
    Ping(SelftestCommon),
    /// Bulk read or write from this node to the --to nodes.
    Brw {
        #[command(flatten)]
        common: SelftestCommon,
        /// Bytes per operation (up to 1M; K and M suffixes).
        #[arg(long, default_value = "4K")]
        size: String,
        /// Read (GET) from the targets (the default, as `lst`).
        #[arg(long, conflicts_with = "write")]
        read: bool,
        /// Write (PUT) to the targets.
        #[arg(long)]
        write: bool,
        /// Check the data of reads.
        #[arg(long)]
        check: bool,
    },
}

#[derive(Debug, clap::Args)]
struct SelftestCommon {
    /// Target NIDs: NID[,NID…] (nodes run by `colibri lnet run`).
    #[arg(long)]
    to: String,
    /// Seconds.
    #[arg(long, default_value_t = 10)]
    duration: u32,
    /// Operations in flight.
    #[arg(long, default_value_t = 1)]
    concurrency: u32,
    /// Seconds between interval reports (0: none).
    #[arg(long, default_value_t = 1)]
    interval: u32,
    /// Source nodes: NID[,NID…] (their default control sockets) or socket
    /// paths (with a `/`). Default: the node of --ctl alone.
    #[arg(long)]
    from: Option<String>,
}

/// A comma-separated list; a comma inside brackets belongs to its item
/// (NID ranges such as `5.5.5.[1,2,3-4]@o2ib`).
fn list(s: &str) -> Vec<String> {
    colibri_lnet_rt::colibri_lnet::nidrange::split_nid_list(s)
        .into_iter()
        .map(str::to_owned)
        .collect()
}

/// A NID list whose items may name hosts (`ping node1@tcp`): lnetctl's
/// `libcfs_ip_str2addr` falls back on the resolver for a name that is
/// not an address; so do we, here in the client (the node is not kept
/// waiting on a resolver), for the nets whose NIDs are IPv4 addresses.
/// An item that does not resolve stays as written, and the node refuses
/// it as "not a NID".
fn resolved_list(s: &str) -> Vec<String> {
    list(s)
        .into_iter()
        .map(|e| resolve_host(&e).unwrap_or(e))
        .collect()
}

fn resolve_host(expr: &str) -> Option<String> {
    use colibri_lnet_rt::colibri_lnet::ids::{LndType, Net};
    use std::net::{IpAddr, Ipv4Addr, ToSocketAddrs};
    let (host, net) = expr.rsplit_once('@')?;
    if host.is_empty()
        || host.contains(['[', ']', '*'])
        || host.parse::<Ipv4Addr>().is_ok()
        || !host.chars().any(|c| c.is_ascii_alphabetic())
    {
        return None;
    }
    let lnd = net.parse::<Net>().ok()?.lnd();
    if !matches!(lnd, LndType::Tcp | LndType::O2ib) {
        return None;
    }
    let ip = (host, 0)
        .to_socket_addrs()
        .ok()?
        .find_map(|a| match a.ip() {
            IpAddr::V4(v4) => Some(v4),
            IpAddr::V6(_) => None,
        })?;
    Some(format!("{ip}@{net}"))
}

fn print_doc(out: &mut impl Write, doc: &Doc, json: bool) {
    if matches!(doc, Doc::Null) {
        return;
    }
    let _ = if json {
        writeln!(out, "{}", doc.to_json())
    } else {
        write!(out, "{}", doc.to_yaml())
    };
    let _ = out.flush();
}

fn fail(f: &Failure, json: bool) -> ExitCode {
    print_doc(&mut std::io::stderr(), &f.to_doc(), json);
    ExitCode::FAILURE
}

/// Runs `colibri lnet …`.
pub(crate) fn lnet_main(a: &LnetArgs) -> ExitCode {
    if let LnetCmd::Run(r) = &a.cmd {
        return match run(a, r) {
            Ok(()) => ExitCode::SUCCESS,
            Err(f) => fail(&f, a.json),
        };
    }
    if let LnetCmd::Import {
        file, exec: true, ..
    } = &a.cmd
    {
        return import_exec(a, file.as_deref());
    }
    if let LnetCmd::Legacy2yaml(l) = &a.cmd {
        return legacy2yaml(l, a.json);
    }
    let cmd = match command(&a.cmd) {
        Ok(c) => c,
        Err(f) => return fail(&f, a.json),
    };
    if let LnetCmd::Net(NetCmd::Add { cpt: Some(c), .. }) = &a.cmd {
        eprintln!("warning: --cpt {c}: CPTs have no meaning here (one partition), ignored");
    }
    if let (LnetCmd::Selftest(s), Command::Selftest(_)) = (&a.cmd, &cmd) {
        let common = match s {
            SelftestCmd::Ping(c) | SelftestCmd::Brw { common: c, .. } => c,
        };
        if let Some(from) = &common.from {
            return selftest_group(a, &cmd, &list(from));
        }
    }
    let path = match ctl_path(a) {
        Ok(p) => p,
        Err(f) => return fail(&f, a.json),
    };
    let timeout = cmd.deadline(Duration::from_secs(a.ctl_timeout.max(1)));
    let mut stdout = std::io::stdout();
    let res = ctl::call(&path, &cmd, timeout, |d| print_doc(&mut stdout, d, a.json));
    match res {
        Ok(doc) => {
            match (&a.cmd, &cmd) {
                (LnetCmd::Export { file: Some(f), .. }, _) => {
                    if let Err(e) = std::fs::write(f, doc.to_yaml()) {
                        return fail(
                            &Failure::new(
                                "export",
                                "config",
                                e.raw_os_error().unwrap_or(errno::EIO),
                                format!("cannot write {}: {e}", f.display()),
                            ),
                            a.json,
                        );
                    }
                }
                (_, Command::Import { .. } | Command::Set { .. }) => {
                    // Warnings go to standard error.
                    for w in doc.get("warnings").map(Doc::items).unwrap_or_default() {
                        eprintln!("warning: {}", w.as_text().unwrap_or_default());
                    }
                }
                _ => print_doc(&mut stdout, &doc, a.json),
            }
            ExitCode::SUCCESS
        }
        Err(f) => fail(&f, a.json),
    }
}

/// `legacy2yaml`: the sources in Lustre's order, the document to
/// standard output or `--output`.
fn legacy2yaml(l: &Legacy2yamlArgs, json: bool) -> ExitCode {
    use colibri_lnet_rt::legacy::{Legacy, LegacyError, Param};
    let fail = |what: String| {
        eprintln!("error: {what}");
        ExitCode::from(2)
    };
    let read = |f: &Path| {
        std::fs::read_to_string(f).map_err(|e| format!("cannot read {}: {e}", f.display()))
    };
    let mut doc = Legacy::default();
    let files = l
        .modprobe
        .iter()
        .map(|f| (f, "modprobe", None))
        .chain(
            l.ip2nets
                .iter()
                .map(|f| (f, "ip2nets", Some(Param::Ip2nets))),
        )
        .chain(l.routes.iter().map(|f| (f, "routes", Some(Param::Routes))))
        .chain(
            l.networks
                .iter()
                .map(|f| (f, "networks", Some(Param::Networks))),
        );
    let mut any_file = false;
    for (f, kind, param) in files {
        any_file = true;
        let text = match read(f) {
            Ok(t) => t,
            Err(e) => return fail(e),
        };
        let res: Result<(), LegacyError> = match param {
            None => doc.add_modprobe(&text),
            Some(p) => doc.add_param(p, &text),
        };
        if let Err(e) = res {
            return fail(format!("{kind} file {}: {e}", f.display()));
        }
    }
    let inline = match &l.inline {
        Some(s) => Some(s.clone()),
        // Standard input only when nothing else was given, so that a
        // caller whose input stays open does not wait forever.
        None if !any_file && !std::io::IsTerminal::is_terminal(&std::io::stdin()) => {
            match read_stdin("legacy2yaml") {
                Ok(s) => Some(s),
                Err(f) => return fail(f.descr),
            }
        }
        None => None,
    };
    if let Some(text) = inline.filter(|t| !t.trim().is_empty())
        && let Err(e) = doc.add_inline(&text)
    {
        return fail(e.to_string());
    }
    if doc.is_empty() {
        eprintln!(
            "error: no ip2nets, routes, or networks data provided (give -m/-i/-r/-n files, an inline string or standard input)"
        );
        return ExitCode::from(1);
    }
    if let Some(h) = l.default_hop
        && let Err(e) = doc.set_default_hop(h)
    {
        return fail(e.to_string());
    }
    let text = if json {
        format!("{}\n", doc.to_doc().to_json())
    } else {
        doc.to_yaml()
    };
    match &l.output {
        Some(f) => {
            if let Err(e) = std::fs::write(f, text) {
                return fail(format!("cannot write {}: {e}", f.display()));
            }
        }
        None => {
            let mut out = std::io::stdout();
            if out
                .write_all(text.as_bytes())
                .and_then(|()| out.flush())
                .is_err()
            {
                return ExitCode::from(2);
            }
        }
    }
    ExitCode::SUCCESS
}

/// The node's control socket: `--ctl`, else the only one found.
fn ctl_path(a: &LnetArgs) -> Result<PathBuf, Failure> {
    match &a.ctl {
        Some(p) => Ok(p.clone()),
        None => ctl::find_default(),
    }
}

/// `import --exec [FILE]`: each `ping` and `discover` of the file in
/// turn, its answer printed as the command's; every one runs, and the
/// exit status says whether all succeeded.
fn import_exec(a: &LnetArgs, file: Option<&Path>) -> ExitCode {
    let cmds = (|| {
        let yaml = match file {
            Some(f) if f != Path::new("-") => read_file(f, "import")?,
            _ => read_stdin("import")?,
        };
        ctl::exec_commands(&yaml)
    })();
    let (cmds, path) = match cmds.and_then(|c| Ok((c, ctl_path(a)?))) {
        Ok(x) => x,
        Err(f) => return fail(&f, a.json),
    };
    let mut stdout = std::io::stdout();
    let mut status = ExitCode::SUCCESS;
    for cmd in &cmds {
        let timeout = cmd.deadline(Duration::from_secs(a.ctl_timeout.max(1)));
        match ctl::call(&path, cmd, timeout, |d| print_doc(&mut stdout, d, a.json)) {
            Ok(doc) => print_doc(&mut stdout, &doc, a.json),
            Err(f) => status = fail(&f, a.json),
        }
    }
    status
}

fn command(c: &LnetCmd) -> Result<Command, Failure> {
    Ok(match c {
        LnetCmd::Run(_) | LnetCmd::Legacy2yaml(_) => unreachable!("handled by lnet_main"),
        LnetCmd::Net(n) => match n {
            NetCmd::Add {
                nid,
                net,
                interfaces,
                ip2net,
                cpt: _,
                credits,
                peer_credits,
                peer_buffer_credits,
                conns_per_peer,
                tos,
                peer_timeout,
            } => Command::NetAdd {
                nid: nid.clone(),
                net: net.clone(),
                interfaces: interfaces.clone(),
                ip2net: ip2net.clone(),
                credits: *credits,
                peer_credits: *peer_credits,
                peer_buffer_credits: *peer_buffer_credits,
                tos: *tos,
                peer_timeout: *peer_timeout,
                conns_per_peer: *conns_per_peer,
            },
            NetCmd::Del {
                nid,
                net,
                interfaces,
            } => Command::NetDel {
                nid: nid.clone(),
                net: net.clone(),
                interfaces: interfaces.clone(),
            },
            NetCmd::Set(h) => Command::NetSet {
                nid: h.nid.clone(),
                all: h.all,
                health: h.health,
                conns_per_peer: h.conns_per_peer,
                net: h.net.clone(),
                lnd_timeout: h.lnd_timeout,
            },
            NetCmd::Show { net, verbose } => Command::NetShow {
                detail: verbose.unwrap_or(0),
                net: net.clone(),
                verbose: verbose.is_some_and(|l| l > 0),
            },
        },
        LnetCmd::Peer(p) => match p {
            PeerCmd::Add {
                prim_nid,
                nid,
                non_mr,
                lock_prim,
            } => Command::PeerAdd {
                prim_nid: prim_nid.clone(),
                nids: nid.as_deref().map(list).unwrap_or_default(),
                non_mr: *non_mr,
                lock_prim: *lock_prim,
            },
            PeerCmd::Del {
                prim_nid,
                nid,
                force,
            } => Command::PeerDel {
                prim_nid: prim_nid.clone(),
                nids: nid.as_deref().map(list).unwrap_or_default(),
                force: *force,
            },
            PeerCmd::Show { nid, verbose } => Command::PeerShow {
                detail: verbose.unwrap_or(0),
                nid: nid.clone(),
                verbose: verbose.is_some_and(|l| l > 0),
            },
            PeerCmd::Set(h) => Command::PeerSet {
                nid: h.which.nid.clone(),
                all: h.which.all,
                health: h.health,
                state: h.state,
            },
            PeerCmd::List => Command::PeerList,
        },
        LnetCmd::Lnet(LnetUpDown::Configure { all }) => Command::LnetConfigure { all: *all },
        LnetCmd::Lnet(LnetUpDown::Unconfigure) => Command::LnetUnconfigure,
        LnetCmd::Udsp(u) => match u {
            UdspCmd::Add {
                src,
                dst,
                rte,
                priority,
                idx,
            } => Command::UdspAdd {
                src: src.clone(),
                dst: dst.clone(),
                rte: rte.clone(),
                priority: *priority,
                idx: *idx,
            },
            UdspCmd::Del { idx, all } => Command::UdspDel {
                idx: *idx,
                all: *all,
            },
            UdspCmd::Show { idx } => Command::UdspShow { idx: *idx },
        },
        LnetCmd::Route(r) => match r {
            RouteCmd::Add {
                net,
                gateway,
                hop,
                priority,
            } => Command::RouteAdd {
                net: net.clone(),
                gateway: gateway.clone(),
                hop: *hop,
                priority: *priority,
            },
            RouteCmd::Del { net, gateway } => Command::RouteDel {
                net: net.clone(),
                gateway: gateway.clone(),
            },
            RouteCmd::Show {
                net,
                gateway,
                verbose,
            } => Command::RouteShow {
                net: net.clone(),
                gateway: gateway.clone(),
                verbose: *verbose,
            },
        },
        LnetCmd::Routing(ShowOnly::Show { .. }) => Command::RoutingShow,
        LnetCmd::Set { name, value } => Command::Set {
            name: name.clone(),
            value: value.clone(),
        },
        LnetCmd::Global(ShowOnly::Show { .. }) => Command::GlobalShow,
        LnetCmd::Debug(DebugCmd::Recovery { peer, .. }) => Command::DebugRecovery { peer: *peer },
        LnetCmd::Debug(DebugCmd::Peer { nid }) => Command::DebugPeer { nid: nid.clone() },
        LnetCmd::Stats(StatsCmd::Show) => Command::StatsShow,
        LnetCmd::Stats(StatsCmd::Reset) => Command::StatsReset,
        LnetCmd::Ping {
            nids,
            timeout,
            source,
        } => Command::Ping {
            nids: resolved_list(nids),
            timeout_ms: timeout.saturating_mul(1000),
            source: source.clone(),
        },
        LnetCmd::Discover {
            nids,
            force,
            timeout,
        } => Command::Discover {
            nids: resolved_list(nids),
            force: *force,
            timeout_ms: timeout.saturating_mul(1000),
        },
        LnetCmd::Export { .. } => Command::Export,
        LnetCmd::Import { file, del, .. } => Command::Import {
            yaml: match file.as_deref() {
                Some(f) if f != Path::new("-") => read_file(f, "import")?,
                _ => read_stdin("import")?,
            },
            del: *del,
        },
        LnetCmd::Fault(f) => {
            let (kind, op) = match f {
                FaultCmd::Drop(op) => (FaultKind::Drop, op),
                FaultCmd::Delay(op) => (FaultKind::Delay, op),
            };
            match op {
                FaultOp::Add(r) => Command::FaultAdd {
                    kind,
                    rule: FaultArgs {
                        source: Some(r.source.clone()),
                        dest: Some(r.dest.clone()),
                        local: r.local.clone(),
                        rate: r.rate,
                        interval: r.interval,
                        portals: r.portal.clone(),
                        messages: r.message.iter().flat_map(|m| list(m)).collect(),
                        latency: r.latency,
                        health_errors: r.health_error.iter().flat_map(|m| list(m)).collect(),
                    },
                },
                FaultOp::Del { source, dest, all } => Command::FaultDel {
                    kind,
                    source: source.clone(),
                    dest: dest.clone(),
                    all: *all,
                },
                FaultOp::Show => Command::FaultShow { kind: Some(kind) },
                FaultOp::Reset => Command::FaultReset { kind },
            }
        }
        LnetCmd::Selftest(s) => {
            let (kind, c) = match s {
                SelftestCmd::Ping(c) => (SelftestKind::Ping, c),
                SelftestCmd::Brw {
                    common,
                    size,
                    read: _,
                    write,
                    check,
                } => {
                    let size = colibri_bench::parse_size(size)
                        .ok()
                        .and_then(|s| u32::try_from(s).ok())
                        .ok_or_else(|| {
                            Failure::new(
                                "selftest",
                                "brw",
                                errno::EINVAL,
                                format!(
                                    "--size {size}: expected bytes with an optional K or M suffix"
                                ),
                            )
                        })?;
                    (
                        SelftestKind::Brw {
                            read: !*write,
                            size,
                            check: *check,
                        },
                        common,
                    )
                }
            };
            Command::Selftest(SelftestSpec {
                kind,
                to: list(&c.to),
                duration_s: c.duration,
                concurrency: c.concurrency,
                interval_s: c.interval,
            })
        }
    })
}

fn read_file(file: &Path, op: &str) -> Result<String, Failure> {
    std::fs::read_to_string(file).map_err(|e| {
        Failure::new(
            op,
            "config",
            e.raw_os_error().unwrap_or(errno::EIO),
            format!("cannot read {}: {e}", file.display()),
        )
    })
}

fn read_stdin(op: &str) -> Result<String, Failure> {
    let mut s = String::new();
    std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).map_err(|e| {
        Failure::new(
            op,
            "config",
            e.raw_os_error().unwrap_or(errno::EIO),
            format!("cannot read standard input: {e}"),
        )
    })?;
    Ok(s)
}

/// Set by SIGINT or SIGTERM.
fn stop_flag() -> Result<Arc<AtomicBool>, Failure> {
    let flag = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&flag)).map_err(|e| {
            Failure::new(
                "run",
                "signal",
                errno::EIO,
                format!("cannot catch signal {sig}: {e}"),
            )
        })?;
    }
    Ok(flag)
}

fn run(a: &LnetArgs, r: &RunArgs) -> Result<(), Failure> {
    let (mut conf, source) = match &r.config {
        Some(path) => {
            let text = read_file(path, "configure")?;
            let (conf, warnings) = NodeConf::from_yaml(&text).map_err(|e| {
                Failure::new(
                    "configure",
                    "config",
                    e.errno(),
                    format!("{}: {e}", path.display()),
                )
            })?;
            for w in &warnings {
                tracing::warn!(target: "colibri::lnet", "{}: {w}", path.display());
            }
            (conf, path.display().to_string())
        }
        None => (NodeConf::empty(), "module parameters".to_owned()),
    };
    let warnings = conf
        .add_module_params(
            r.networks.as_deref(),
            r.ip2nets.as_deref(),
            r.routes.as_deref(),
        )
        .map_err(|e| Failure::new("configure", "config", e.errno(), e.to_string()))?;
    for w in &warnings {
        tracing::warn!(target: "colibri::lnet", "{source}: {w}");
    }
    let stop = stop_flag()?;
    let pipes = r.splice_pipes;
    let daemon = Daemon::start_with(&conf, |cfg| cfg.splice_pipes = pipes)?;
    let primary = conf.nis[0].nid.to_string();
    let path = a.ctl.clone().unwrap_or_else(|| ctl::default_path(&primary));
    let mut server = match CtlServer::start(daemon.clone(), &path) {
        Ok(s) => s,
        Err(f) => {
            daemon.shutdown();
            return Err(f);
        }
    };
    let lnet = daemon.lnet();
    let listen: Vec<String> = lnet
        .nids()
        .iter()
        .filter_map(|n| lnet.listen_addr(*n).map(|a| format!("{n}={a}")))
        .collect();
    let mut out = std::io::stdout();
    // A closed standard output (a reader that went away) must not stop
    // the node: write errors are ignored.
    let _ = writeln!(
        out,
        "READY pid={} nids={} ctl={} listen={}",
        std::process::id(),
        lnet.nids()
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(","),
        path.display(),
        listen.join(",")
    );
    let _ = out.flush();
    tracing::info!(target: "colibri::lnet", ctl = %path.display(), "node running");
    if r.exit_on_eof {
        let s = stop.clone();
        let _ = std::thread::Builder::new()
            .name("stdin-watch".into())
            .spawn(move || {
                let mut buf = [0u8; 64];
                let mut stdin = std::io::stdin();
                while matches!(std::io::Read::read(&mut stdin, &mut buf), Ok(n) if n > 0) {}
                s.store(true, Ordering::Release);
            });
    }
    while !stop.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(50));
    }
    tracing::info!(target: "colibri::lnet", "stopping");
    server.stop();
    let summary = daemon.summary();
    daemon.shutdown();
    let _ = writeln!(out, "STOPPED {summary}");
    let _ = out.flush();
    Ok(())
}

/// `selftest … --from A,B`: the test runs from every source node at once
/// (each through its control socket); intervals are printed as they come
/// with a `from:` key, then each source's summary and the totals.
fn selftest_group(a: &LnetArgs, cmd: &Command, from: &[String]) -> ExitCode {
    if from.is_empty() {
        return fail(
            &Failure::new("selftest", "run", errno::EINVAL, "--from names no node"),
            a.json,
        );
    }
    let timeout = cmd.deadline(Duration::from_secs(a.ctl_timeout.max(1)));
    let out = std::sync::Mutex::new(std::io::stdout());
    let tagged = |src: &str, doc: &Doc| -> Doc {
        match doc {
            Doc::Map(m) => Doc::Map(
                m.iter()
                    .map(|(k, v)| {
                        let mut inner = Doc::map().with("from", src);
                        if let Doc::Map(vm) = v {
                            for (ik, iv) in vm {
                                inner.push(ik, iv.clone());
                            }
                        }
                        (k.clone(), inner)
                    })
                    .collect(),
            ),
            other => other.clone(),
        }
    };
    let results: Vec<(String, Result<Doc, Failure>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = from
            .iter()
            .map(|src| {
                let path = if src.contains('/') {
                    PathBuf::from(src)
                } else {
                    ctl::default_path(src)
                };
                let (out, tagged) = (&out, &tagged);
                let h = scope.spawn(move || {
                    ctl::call(&path, cmd, timeout, |d| {
                        if let Ok(mut o) = out.lock() {
                            print_doc(&mut *o, &tagged(src, d), a.json);
                        }
                    })
                });
                (src.clone(), h)
            })
            .collect();
        handles
            .into_iter()
            .map(|(src, h)| {
                let r = h.join().unwrap_or_else(|_| {
                    Err(Failure::new(
                        "selftest",
                        "run",
                        errno::EIO,
                        "source thread failed",
                    ))
                });
                (src, r)
            })
            .collect()
    });
    let mut ok = true;
    let (mut rpcs, mut errors, mut rate, mut mib) = (0i64, 0i64, 0i64, 0f64);
    let mut stdout = std::io::stdout();
    for (src, r) in &results {
        match r {
            Ok(doc) => {
                let st = doc.get("selftest");
                let num = |k: &str| st.and_then(|s| s.get(k)).and_then(Doc::as_i64).unwrap_or(0);
                rpcs += num("rpcs");
                errors += num("errors");
                rate += num("rate");
                mib += st
                    .and_then(|s| s.get("bandwidth MiB/s"))
                    .and_then(Doc::as_text)
                    .and_then(|t| t.parse::<f64>().ok())
                    .unwrap_or(0.0);
                print_doc(&mut stdout, &tagged(src, doc), a.json);
            }
            Err(f) => {
                ok = false;
                let mut f = f.clone();
                f.descr = format!("{src}: {}", f.descr);
                print_doc(&mut std::io::stderr(), &f.to_doc(), a.json);
            }
        }
    }
    print_doc(
        &mut stdout,
        &Doc::map().with(
            "total",
            Doc::map()
                .with("sources", from.len())
                .with("rpcs", rpcs)
                .with("rate", rate)
                .with("bandwidth MiB/s", format!("{mib:.2}"))
                .with("errors", errors),
        ),
        a.json,
    );
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
