//! A fabric of 1,024 simulated nodes (clients on two nets, eight routers,
//! servers on a third net): every client PUTs to a server through the
//! routers, then a router dies and the fabric carries on through the
//! others. Runs in seconds: the simulator's cost per message does not
//! grow with the node count (see `colibri bench --scale`).

use colibri_lnet::scale::{Fabric, FabricShape};

#[test]
fn a_thousand_nodes_route_through_eight_routers_and_survive_losing_one() {
    let shape = FabricShape::for_nodes(1024);
    assert_eq!(shape.nodes(), 1024);
    assert_eq!(shape.routers, 8);
    let mut f = Fabric::build(shape, 11).unwrap();

    // Every client reaches its server (the first round also discovers
    // the peers).
    let first = f.round().unwrap();
    assert_eq!(first.acked, shape.clients, "{first:?}");
    let steady = f.round().unwrap();
    assert_eq!(steady.acked, shape.clients, "{steady:?}");
    // PUT and ACK, each over two hops.
    assert_eq!(steady.wire_messages, 4 * shape.clients, "{steady:?}");
    let routers_used = (0..shape.routers)
        .filter(|r| f.sim().node(&format!("router{r}")).stats().route_count > 0)
        .count();
    assert_eq!(routers_used, shape.routers, "every router carries traffic");

    // Router 0 dies. Every PUT still ends exactly once, and none is
    // lost: a send to the dead router fails on its connection
    // (RemoteDropped), health lowers that gateway's NI, and LNet resends
    // through another router within the same transaction.
    f.kill_router(0);
    let hit = f.round().unwrap();
    assert_eq!(hit.acked + hit.failed, shape.clients, "{hit:?}");
    assert_eq!(
        hit.acked, shape.clients,
        "resent through live routers: {hit:?}"
    );
    assert!(
        hit.wire_messages > steady.wire_messages,
        "some sends tried the dead router first: {hit:?}"
    );
    // Once the dead router is known dead, everything goes through the
    // seven others.
    let after = f.round().unwrap();
    assert_eq!(after.acked, shape.clients, "{after:?}");
    assert_eq!(after.failed, 0, "{after:?}");
}
