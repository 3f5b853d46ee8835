//! `rollgate log follow`, run for real on a log that is written, rotated and truncated under it:
//! every record comes out whole, once, in order.

use crate::common::*;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn append(path: &Path, text: &str) {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    file.write_all(text.as_bytes()).unwrap();
}

fn record(n: usize, version: &str) -> String {
    format!(
        "{{\"ts\":{},\"event\":\"replica_ready\",\"service\":\"edge-svc\",\"version\":\"{version}\",\"slot\":{n},\"detail\":\"record {n}\"}}",
        1_793_613_600 + n
    )
}

/// `rollgate log follow ARGS`, its stdout's lines collected as they come.
fn follow(args: &[&str]) -> (Child, Arc<Mutex<Vec<String>>>) {
    let mut child = std::process::Command::new(crate::common::bin())
        .args(["log", "follow"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = Arc::new(Mutex::new(Vec::new()));
    let seen = lines.clone();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            seen.lock().unwrap().push(line);
        }
    });
    (child, lines)
}

/// Whether process `pid` has `path` open (the follower keeps the log it reads open).
fn holds_open(pid: u32, path: &Path) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten()
        .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|target| target == path))
}

fn wait_for_lines(lines: &Arc<Mutex<Vec<String>>>, count: usize) -> Vec<String> {
    wait_for(20, || lines.lock().unwrap().len() >= count);
    lines.lock().unwrap().clone()
}

#[test]
fn every_record_comes_out_whole_once_and_in_order_through_rotation_and_truncation() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("deploy.log");
    // The log does not exist yet: the follower waits for it, and says so once it has looked.
    let (mut child, lines) = follow(&[log.to_str().unwrap(), "--format", "json"]);
    let mut said = String::new();
    BufReader::new(child.stderr.take().unwrap())
        .read_line(&mut said)
        .unwrap();
    assert!(
        said.contains("does not exist yet; waiting for it"),
        "{said}"
    );
    let mut expected = Vec::new();
    let write = |path: &Path, n: usize| -> String {
        let line = record(n, "v2");
        append(path, &format!("{line}\n"));
        line
    };
    expected.push(write(&log, 0));
    expected.push(write(&log, 1));
    // Half a record, then the rest: never printed in halves.
    let half = record(2, "v2");
    let (first, rest) = half.split_at(half.len() / 2);
    append(&log, first);
    std::thread::sleep(Duration::from_millis(400));
    append(&log, &format!("{rest}\n"));
    expected.push(half.clone());
    assert_eq!(wait_for_lines(&lines, 3), expected[..3]);
    // logrotate's default: the file renamed, a late write to it, then a new file.
    let rotated = dir.path().join("deploy.log.1");
    std::fs::rename(&log, &rotated).unwrap();
    expected.push(write(&rotated, 3));
    expected.push(write(&log, 4));
    expected.push(write(&log, 5));
    assert_eq!(wait_for_lines(&lines, 6), expected[..6]);
    // copytruncate: copied away, truncated in place, written again. One record is shorter than
    // the two the follower had read, so it sees the truncation whenever it looks; the next is
    // written once that one is out.
    std::fs::copy(&log, dir.path().join("deploy.log.2")).unwrap();
    std::fs::write(&log, "").unwrap();
    expected.push(write(&log, 6));
    assert_eq!(wait_for_lines(&lines, 7), expected[..7]);
    expected.push(write(&log, 7));
    let got = wait_for_lines(&lines, 8);
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(got, expected);
}

#[test]
fn from_the_start_with_the_filters_and_formats_of_the_history() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("deploy.log");
    for n in 0..4 {
        append(
            &log,
            &format!("{}\n", record(n, if n % 2 == 0 { "v1" } else { "v2" })),
        );
    }
    append(&log, "not a record\n");
    let (mut child, lines) = follow(&[
        log.to_str().unwrap(),
        "--from-start",
        "--version",
        "v2",
        "--format",
        "csv",
    ]);
    append(&log, &format!("{}\n", record(5, "v2")));
    let got = wait_for_lines(&lines, 4);
    child.kill().unwrap();
    let output = child.wait_with_output().unwrap();
    assert_eq!(
        got,
        [
            "ts,event,service,version,slot,detail",
            "1793613601,replica_ready,edge-svc,v2,1,record 1",
            "1793613603,replica_ready,edge-svc,v2,3,record 3",
            "1793613605,replica_ready,edge-svc,v2,5,record 5",
        ]
    );
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("a line that is not a record, skipped"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // From the end (the default): nothing old, then what is appended once it holds the log.
    let (mut child, lines) = follow(&[log.to_str().unwrap()]);
    assert!(
        wait_for(20, || holds_open(child.id(), &log)),
        "the follower opened the log"
    );
    // Holding the log open is not yet having found its end: a record appended in between is
    // rightly one of the old ones. So records are appended until one comes out; each that
    // comes out is one appended now, never an old one.
    let mut appended = 6;
    loop {
        append(&log, &format!("{}\n", record(appended, "v1")));
        if wait_for(2, || !lines.lock().unwrap().is_empty()) || appended == 15 {
            break;
        }
        appended += 1;
    }
    let got = wait_for_lines(&lines, 1);
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!got.is_empty(), "nothing came out");
    for line in &got {
        let n: usize = line
            .rsplit("record ")
            .next()
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0);
        assert!(
            line.contains("replica_ready") && (6..=appended).contains(&n),
            "{got:?}"
        );
    }
}
