//! A child process run to completion with a deadline, its output drained as it comes (the
//! pymongo and Node.js runners).

use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs `cmd` to completion with piped output, killing it past `deadline`.
pub fn run(mut cmd: Command, deadline: Duration) -> Result<Output, String> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawn {:?}: {e}", cmd.get_program()))?;
    // Drained on threads so a chatty child never blocks on a full pipe.
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            buf
        })
    };
    let stdout = drain(Box::new(child.stdout.take().expect("piped stdout")));
    let stderr = drain(Box::new(child.stderr.take().expect("piped stderr")));
    let until = Instant::now() + deadline;
    let status = loop {
        match child.try_wait().map_err(|e| format!("wait: {e}"))? {
            Some(status) => break status,
            None if Instant::now() > until => {
                let _ = child.kill();
                let _ = child.wait();
                let (o, e) = (stdout.join(), stderr.join());
                let text = |b: std::thread::Result<Vec<u8>>| {
                    String::from_utf8_lossy(&b.unwrap_or_default()).into_owned()
                };
                return Err(format!("ran past {deadline:?}\n{}{}", text(o), text(e)));
            }
            None => std::thread::sleep(Duration::from_millis(10)),
        }
    };
    Ok(Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}
