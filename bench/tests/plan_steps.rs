//! `Plan::steps` counts exactly the progress steps `run_plan` reports, so
//! that "step N of M" never runs past M.

use colibri_bench::PairConfig;
use colibri_bench::report::{Plan, run_plan};
use colibri_bulk_mem::{MemConfig, MemTransport};

#[test]
fn steps_match_the_progress_reported() {
    let xprt = MemTransport::new(MemConfig::blocking());
    for tests in [&["all"][..], &["rtt", "bulk"], &["rpc"], &["oneway"]] {
        let mut plan = Plan::smoke(false);
        plan.tests = tests.iter().map(|t| (*t).to_string()).collect();
        plan.rtt_iters = 20;
        plan.oneway_count = 200;
        plan.rpc_iters = 20;
        plan.rpc_oneway_count = 200;
        plan.bulk_bytes = 1 << 20;
        let mut calls = 0;
        run_plan(&plan, &xprt, &PairConfig::mem(), &mut |_| calls += 1).unwrap();
        assert_eq!(calls, plan.steps(), "tests {tests:?}");
    }
}
