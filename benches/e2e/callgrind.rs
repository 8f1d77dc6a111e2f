//! Instructions a proxy run under callgrind executes in the measured window, for
//! `E2E_CALLGRIND=1` (with `E2E_SG_WRAPPER="valgrind --tool=callgrind ..."`): a count that
//! does not depend on how loaded the machine is, unlike CPU time, so builds can be compared
//! on a shared machine. User space only (callgrind sees no kernel time).
//!
//! The counters are zeroed at the window's start (`callgrind_control -z`) and read at its
//! end (`callgrind_control -e`, summed over the threads); the window's profile is then
//! dumped (`callgrind_control -d`: a file beside the one `--callgrind-out-file` names, with
//! a `.N` suffix), for `callgrind_annotate`.

use std::process::Command;

fn control(args: &[&str], pid: u32) -> Result<String, String> {
    let out = Command::new("callgrind_control")
        .args(args)
        .arg(pid.to_string())
        .output()
        .map_err(|e| format!("callgrind_control: {e}"))?;
    if !out.status.success() {
        return Err(format!("callgrind_control {args:?}: {}", out.status));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Zeroes the event counters of the callgrind run `pid`.
pub fn zero(pid: u32) -> Result<(), String> {
    control(&["-z"], pid).map(|_| ())
}

/// Instructions executed by every thread of `pid` since the counters were zeroed.
pub fn instructions(pid: u32) -> Result<u64, String> {
    let text = control(&["-e"], pid)?;
    // "   Th 1  302,475" per thread, after a "Totals: Ir" header.
    let mut sum = 0u64;
    let mut threads = 0;
    for line in text.lines() {
        let mut words = line.split_whitespace();
        if words.next() != Some("Th") {
            continue;
        }
        let Some(count) = words.nth(1) else { continue };
        let count: u64 = count
            .replace(',', "")
            .parse()
            .map_err(|_| format!("callgrind_control -e: {line:?}"))?;
        sum += count;
        threads += 1;
    }
    if threads == 0 {
        return Err(format!("callgrind_control -e printed no thread: {text:?}"));
    }
    control(&["-d"], pid)?;
    Ok(sum)
}
