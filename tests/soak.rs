//! The CI minute of the soak (`cargo bench --bench soak` runs the same harness for an hour):
//! 60 s of abuse and faults beside verifying clients, then every check, the issue-11
//! hardening ones included (`STALEGUARD_SOAK_SKIP_HARDENING=1` leaves those out, to compare
//! with a build from before the hardening).

#[path = "../benches/soak/harness/mod.rs"]
mod harness;

#[test]
fn soak_minute() {
    let mut opts = harness::Opts::ci(std::path::Path::new(env!("CARGO_BIN_EXE_staleguard")));
    opts.expect_hardening = std::env::var_os("STALEGUARD_SOAK_SKIP_HARDENING").is_none();
    let report = harness::run(&opts).expect("the soak runs");
    println!("{}", report.text);
    let failed: Vec<String> = report
        .failures()
        .iter()
        .map(|c| format!("{} ({})", c.name, c.value))
        .collect();
    assert!(
        failed.is_empty(),
        "soak checks failed: {failed:?}\n{}",
        report.text
    );
}
