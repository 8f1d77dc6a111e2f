//! The CI minute of the soak (`cargo bench --bench soak` runs the same harness for an hour):
//! 30 s of abuse and faults beside verifying clients, then the checks that hold today.
//! Set `STALEGUARD_SOAK_EXPECT_HARDENING=1` to assert the issue-11 hardening checks too.

#[path = "../benches/soak/harness/mod.rs"]
mod harness;

#[test]
fn soak_minute() {
    let mut opts = harness::Opts::ci(std::path::Path::new(env!("CARGO_BIN_EXE_staleguard")));
    opts.expect_hardening = std::env::var_os("STALEGUARD_SOAK_EXPECT_HARDENING").is_some();
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
