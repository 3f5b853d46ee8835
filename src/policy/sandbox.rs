//! Evaluation in a forked child process.
//!
//! Nickel's parser and typechecker recurse over the syntax tree, so a hostile or broken policy
//! (100 000 nested brackets, a million-term `1 + 1 + ...`) can overflow any stack, and a policy
//! that recurses forever never returns. Neither may take rollgate down or leave a thread
//! spinning. So each evaluation runs in a child: it gets a large stack, an address-space cap and
//! a deadline; it sends its answer back as JSON through a pipe; the parent kills it at the
//! deadline and turns a crash into an error naming the file.
//!
//! Callers fork before starting any other thread (the deploy path loads its policy before the
//! async runtime starts), so the child inherits no held locks.

use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, pipe, ForkResult, Pid};
use serde::{de::DeserializeOwned, Serialize};

use super::PolicyError;

/// Stack the child evaluates on: eight times the main-thread stack `nickel` runs on, so every
/// policy Nickel evaluates evaluates here too. Not more: a policy nested too deep for it runs
/// until the stack is used up, and at 1 GiB that took longer than the 10 s time limit (100 000
/// nested brackets were then reported as an endless evaluation, not as nesting).
const CHILD_STACK_BYTES: usize = 64 << 20;
/// The least stack an evaluation gets: the main-thread stack `nickel` itself runs on.
const MIN_STACK_BYTES: usize = 8 << 20;
/// Address-space cap for the child: a runaway evaluation fails instead of eating the host.
const CHILD_ADDRESS_SPACE_BYTES: u64 = 8 << 30;

/// Runs `work` in a child process and returns its answer, or an error naming `label` if it
/// overruns `timeout` or dies.
pub fn isolated<T, F>(label: &Path, timeout: Duration, work: F) -> Result<T, PolicyError>
where
    T: Serialize + DeserializeOwned,
    F: FnOnce() -> Result<T, PolicyError>,
{
    let mut work = Some(work);
    let labels = [label.to_path_buf()];
    let mut answers = isolated_each(&labels, timeout, 1, |_| match work.take() {
        Some(work) => work(),
        None => Err(PolicyError::Internal("the evaluation ran twice".into())),
    });
    answers.pop().expect("one answer per label")
}

/// Runs `work(i)` for every label `i`, each in its own child with its own `timeout`, at most
/// `parallel` children at a time, and returns the answers in label order. Failing policy files
/// are each evaluated alone, so a CI run with many of them uses every core.
pub fn isolated_each<T, F>(
    labels: &[PathBuf],
    timeout: Duration,
    parallel: usize,
    mut work: F,
) -> Vec<Result<T, PolicyError>>
where
    T: Serialize + DeserializeOwned,
    F: FnMut(usize) -> Result<T, PolicyError>,
{
    reap_exited_evaluators();
    let mut answers: Vec<Option<Result<T, PolicyError>>> = labels.iter().map(|_| None).collect();
    let mut running: Vec<Running> = Vec::new();
    let mut next = 0;
    loop {
        while running.len() < parallel.max(1) && next < labels.len() {
            match start(next, timeout, &mut work) {
                Ok(child) => running.push(child),
                Err(e) => answers[next] = Some(Err(e)),
            }
            next += 1;
        }
        if running.is_empty() {
            break;
        }
        for (child, ending) in wait_for_any(&mut running) {
            let index = child.index;
            answers[index] = Some(conclude(&labels[index], timeout, child, ending));
        }
    }
    answers
        .into_iter()
        .map(|answer| answer.expect("every child was concluded"))
        .collect()
}

/// A child at work, and what it has sent so far.
struct Running {
    index: usize,
    pid: Pid,
    reader: std::fs::File,
    bytes: Vec<u8>,
    deadline: Instant,
}

enum Ending {
    /// The child closed its pipe (answered, or died).
    Closed,
    TimedOut,
}

fn start<T, F>(index: usize, timeout: Duration, work: &mut F) -> Result<Running, PolicyError>
where
    T: Serialize,
    F: FnMut(usize) -> Result<T, PolicyError>,
{
    let sandbox_error = |what: &str, e: nix::Error| {
        PolicyError::Bundle(format!("cannot start the policy evaluator ({what}: {e})"))
    };
    let (reader, writer) = pipe().map_err(|e| sandbox_error("pipe", e))?;
    let parent = nix::unistd::getpid();
    // SAFETY: the child only runs the evaluation, writes to its pipe and `_exit`s; callers fork
    // while single-threaded, so no lock is held across the fork.
    match unsafe { fork() }.map_err(|e| sandbox_error("fork", e))? {
        ForkResult::Child => {
            drop(reader);
            die_with(parent);
            run_child(writer, || work(index))
        }
        ForkResult::Parent { child } => {
            drop(writer);
            Ok(Running {
                index,
                pid: child,
                reader: std::fs::File::from(reader),
                bytes: Vec::new(),
                deadline: Instant::now() + timeout,
            })
        }
    }
}

/// Waits until at least one child has closed its pipe or overrun its deadline, and takes those
/// out of `running`.
fn wait_for_any(running: &mut Vec<Running>) -> Vec<(Running, Ending)> {
    let mut ended = Vec::new();
    while ended.is_empty() {
        let now = Instant::now();
        let soonest = running.iter().map(|c| c.deadline).min().unwrap_or(now);
        let left = soonest.saturating_duration_since(now);
        let wait = PollTimeout::try_from(left.as_millis().min(i32::MAX as u128) as i32)
            .unwrap_or(PollTimeout::MAX);
        let mut fds: Vec<PollFd> = running
            .iter()
            .map(|c| PollFd::new(c.reader.as_fd(), PollFlags::POLLIN))
            .collect();
        let failed = match poll(&mut fds, wait) {
            Ok(_) | Err(nix::Error::EINTR) => false,
            // Not expected with valid descriptors: end every child rather than spin.
            Err(_) => true,
        };
        let ready: Vec<bool> = fds
            .iter()
            .map(|fd| fd.revents().is_some_and(|r| !r.is_empty()))
            .collect();
        drop(fds);
        let closed: Vec<bool> = ready
            .into_iter()
            .zip(running.iter_mut())
            .map(|(ready, child)| failed || (ready && read_some(child)))
            .collect();
        let now = Instant::now();
        for i in (0..running.len()).rev() {
            if closed[i] {
                ended.push((running.swap_remove(i), Ending::Closed));
            } else if running[i].deadline <= now {
                ended.push((running.swap_remove(i), Ending::TimedOut));
            }
        }
    }
    ended
}

/// One read from a child's pipe that poll found ready (one, so it never blocks); true once the
/// pipe is closed.
fn read_some(child: &mut Running) -> bool {
    let mut chunk = [0u8; 64 * 1024];
    match child.reader.read(&mut chunk) {
        Ok(0) => true,
        Ok(n) => {
            child.bytes.extend_from_slice(&chunk[..n]);
            false
        }
        Err(e) => e.kind() != std::io::ErrorKind::Interrupted,
    }
}

/// Turns how a child ended into its answer, or into an error naming `label`.
fn conclude<T: DeserializeOwned>(
    label: &Path,
    timeout: Duration,
    child: Running,
    ending: Ending,
) -> Result<T, PolicyError> {
    if let Ending::TimedOut = ending {
        let _ = kill(child.pid, Signal::SIGKILL);
        reap(child.pid);
        return Err(PolicyError::Timeout {
            path: label.to_path_buf(),
            limit: timeout,
        });
    }
    match serde_json::from_slice::<Result<T, PolicyError>>(&child.bytes) {
        Ok(result) => {
            reap_later(child.pid);
            result
        }
        Err(_) => Err(PolicyError::Crashed {
            path: label.to_path_buf(),
            how: describe(reap(child.pid)),
        }),
    }
}

/// Has the kernel kill this child when rollgate dies (killed, or crashed), so an evaluation
/// that would never end cannot outlive the deadline its parent was there to enforce.
fn die_with(parent: Pid) {
    // SAFETY: PR_SET_PDEATHSIG only sets the signal this process gets when its parent exits.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    // The parent may have died before the prctl: then this child already has a new parent.
    if nix::unistd::getppid() != parent {
        // SAFETY: `_exit` skips atexit handlers and destructors the parent owns.
        unsafe { libc::_exit(1) }
    }
}

fn run_child<T, F>(writer: OwnedFd, work: F) -> !
where
    T: Serialize,
    F: FnOnce() -> Result<T, PolicyError>,
{
    // A stack overflow or panic message would interleave with the parent's output; the parent
    // reports the crash itself.
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        use std::os::fd::AsRawFd;
        // SAFETY: dup2 onto stderr of this single-purpose child.
        unsafe { libc::dup2(null.as_raw_fd(), 2) };
    }
    cap_address_space();
    let stack_bytes = evaluation_stack_bytes();
    let mut file = std::fs::File::from(writer);
    // The evaluation runs on a fresh large stack in this same thread (no thread to start and
    // join), and the answer leaves from that stack: the pipe is closed, handing the parent its
    // answer, before anything is torn down, and `_exit` skips the teardown altogether.
    stacker::grow(stack_bytes, move || {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work))
            .unwrap_or_else(|payload| Err(PolicyError::Internal(panic_message(&*payload))));
        if let Ok(bytes) = serde_json::to_vec(&result) {
            let _ = std::io::Write::write_all(&mut file, &bytes);
        }
        drop(file);
        // SAFETY: `_exit` skips atexit handlers and destructors the parent owns.
        unsafe { libc::_exit(0) }
    })
}

/// Lowers the child's address-space limit to `CHILD_ADDRESS_SPACE_BYTES`, or keeps a lower
/// one it inherited (a CI job's `ulimit -v`).
fn cap_address_space() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_AS) else {
        return;
    };
    let cap = CHILD_ADDRESS_SPACE_BYTES.min(hard);
    if soft > cap {
        let _ = setrlimit(Resource::RLIMIT_AS, cap, cap);
    }
}

/// The evaluation stack: `CHILD_STACK_BYTES`, or a quarter of a lower address-space limit, so
/// that under a tight `ulimit -v` the stack still leaves room for the binary and the heap.
fn evaluation_stack_bytes() -> usize {
    use nix::sys::resource::{getrlimit, Resource};
    match getrlimit(Resource::RLIMIT_AS) {
        Ok((soft, _)) if soft != libc::RLIM_INFINITY => usize::try_from(soft / 4)
            .map_or(CHILD_STACK_BYTES, |quarter| {
                quarter.clamp(MIN_STACK_BYTES, CHILD_STACK_BYTES)
            }),
        _ => CHILD_STACK_BYTES,
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// Evaluators that answered and are still exiting: the kernel frees their memory (about a
/// millisecond for a small policy) while the parent goes on. Reaped by the next evaluation or
/// by `reap_exited_evaluators`; a one-shot command that exits first leaves them to init, like
/// any orphan.
static EXITING: Mutex<Vec<Pid>> = Mutex::new(Vec::new());

/// Queues `child` for reaping, and reaps the queued ones that have finished exiting, so a long
/// run of evaluations (the lone pass of `policy check`) does not pile up zombies.
fn reap_later(child: Pid) {
    let mut exiting = EXITING
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    exiting.push(child);
    exiting.retain(|pid| still_exiting(*pid));
}

fn still_exiting(child: Pid) -> bool {
    loop {
        match waitpid(child, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => return true,
            Err(nix::Error::EINTR) => continue,
            _ => return false,
        }
    }
}

/// Waits for every evaluator that answered but had not finished exiting. Long-running
/// commands call this once their policy is loaded, so no zombie outlives the evaluation.
pub fn reap_exited_evaluators() {
    let exiting = std::mem::take(
        &mut *EXITING
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()),
    );
    for child in exiting {
        reap(child);
    }
}

fn reap(child: Pid) -> Option<WaitStatus> {
    loop {
        match waitpid(child, None) {
            Err(nix::Error::EINTR) => continue,
            other => return other.ok(),
        }
    }
}

fn describe(status: Option<WaitStatus>) -> String {
    match status {
        Some(WaitStatus::Signaled(_, Signal::SIGSEGV | Signal::SIGABRT | Signal::SIGBUS, _)) => {
            "the evaluator crashed, most likely nesting too deep for its stack".into()
        }
        Some(WaitStatus::Signaled(_, signal, _)) => format!("the evaluator was killed by {signal}"),
        Some(WaitStatus::Exited(_, code)) => {
            format!("the evaluator exited with status {code} without an answer (out of memory?)")
        }
        _ => "the evaluator stopped without an answer".into(),
    }
}
