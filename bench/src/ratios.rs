//! Ratios for criterion benches: each measured function records its total
//! time and iteration count under (group, `ours` | `baseline`); at the end
//! the ratio of the mean times per iteration is printed per group.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

static MEANS: Mutex<BTreeMap<(String, String), (Duration, u64)>> = Mutex::new(BTreeMap::new());

/// Records `iters` iterations taking `t` for `who` (`"ours"` or
/// `"baseline"`) in `group`.
pub fn record(group: &str, who: &str, t: Duration, iters: u64) {
    let mut m = MEANS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let e = m.entry((group.to_string(), who.to_string())).or_default();
    e.0 += t;
    e.1 += iters;
}

/// The recorded groups with both figures: (group, ours, baseline), mean
/// seconds per iteration.
pub fn collected() -> Vec<(String, f64, f64)> {
    let m = MEANS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mean = |g: &str, who: &str| {
        m.get(&(g.to_string(), who.to_string()))
            .filter(|v| v.1 > 0)
            .map(|v| v.0.as_secs_f64() / v.1 as f64)
    };
    let mut groups: Vec<&String> = m.keys().map(|(g, _)| g).collect();
    groups.dedup();
    groups
        .into_iter()
        .filter_map(|g| Some((g.clone(), mean(g, "ours")?, mean(g, "baseline")?)))
        .collect()
}

/// Prints the ratio ours/baseline of every group, under `title`.
pub fn print(title: &str) {
    println!("\nratio ours/baseline of the mean time per iteration ({title}):");
    for (g, o, b) in collected() {
        println!(
            "  {g:<18} ours {:>10.3} us  baseline {:>10.3} us  time ratio {:>6.2}",
            o * 1e6,
            b * 1e6,
            o / b
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_of_means() {
        record("t/x", "ours", Duration::from_micros(30), 10);
        record("t/x", "baseline", Duration::from_micros(10), 10);
        record("t/x", "ours", Duration::from_micros(10), 10);
        record("t/only-ours", "ours", Duration::from_micros(1), 1);
        let got = collected();
        let x = got.iter().find(|(g, _, _)| g == "t/x").unwrap();
        assert!((x.1 / x.2 - 2.0).abs() < 1e-9);
        assert!(!got.iter().any(|(g, _, _)| g == "t/only-ours"));
    }
}
