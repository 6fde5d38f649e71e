//! LNet nodes for the transport's tests.

use colibri_lnet_rt::colibri_lnet::socklnd::AcceptPolicy;
use colibri_lnet_rt::{Lnet, LnetConfig};

/// One node per NID over the socket LND on loopback: any free port, any
/// source port admitted (the tests run without privilege), each told the
/// others' addresses.
pub(crate) fn socklnd_nodes(nids: &[&str]) -> Vec<Lnet> {
    let nodes: Vec<Lnet> = nids
        .iter()
        .map(|n| {
            let mut cfg = LnetConfig::new(&[n.parse().unwrap()]);
            cfg.accept_port = 0;
            cfg.accept = AcceptPolicy::All;
            Lnet::start(cfg).unwrap()
        })
        .collect();
    Lnet::introduce(&nodes);
    nodes
}
