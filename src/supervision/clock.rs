//! `rollgate keep-clock`: the keeper of a root's schedules (issue 70) — one small process of
//! rollgate's own per root, started by the supervisor seam (`supervise::ensure`: `up`, every
//! pass of `up --supervise`, the end of every deploy, rollout, restart and `start`), never a
//! crontab or a daemon of its own.
//!
//! At each due time ([`engine::clock`]) it takes the due time in the book
//! (`ROOT/schedules.json`, under its lock) before anything runs, so a due time is taken once
//! whoever keeps the clock; then it starts the run as a one-off of the *live* release (its
//! folder, configuration, secrets, user, confinement and limits: `host::one_off`), its output
//! in a file of its own under `ROOT/schedules/NAME/`, bounded by `timeout_ms`. A run goes on
//! where it started: a
//! deploy that switches meanwhile does not touch it, and the next run takes the new release.
//!
//! One keeper per root: it holds `ROOT/.keepers/clock.lock` for its life; a second one finds it
//! held and leaves. Killed (-9), its runs go on; the next keeper finds them by the book (their
//! pid, or their token while the pid was not yet written), waits for them, and says the due
//! times that passed meanwhile once (`schedule_missed`), taking the latest as a due time only
//! when the schedule says `catch_up = 'last`. It leaves when the service is stopped (`rollgate stop`
//! pauses the schedules; `start` brings a keeper back), has nothing live, or has no schedule,
//! once its runs have ended.

use std::path::PathBuf;
use std::time::Duration;

use crate::engine::clock::{at_due, AtDue, Schedule};
use crate::error::Error;
use crate::host::fault::Fault;
use crate::host::identity::Identity;
use crate::host::journal::{self, Entry, LogEvent};
use crate::host::schedule_book::{Book, Ended, Running};
use crate::host::state::Root;

/// The hidden command a clock keeper runs as.
pub const KEEP_CLOCK_COMMAND: &str = "keep-clock";
/// Due times up to this late are still run on time (a keeper woken late, a busy host); past
/// it they are said missed.
const SLACK: f64 = 1.0;
/// How often the keeper looks at the root again between due times (the policy, a stop).
const LOOK_AGAIN: f64 = 1.0;
/// After SIGTERM at a run's limit, or when `'replace` stops it, how long before its tree is
/// killed.
const RUN_GRACE: Duration = Duration::from_secs(5);

/// What the clock runs for: the live release and the schedules its kept policy gives.
pub(crate) type Live = crate::engine::schedule_status::KeptSchedules;

/// The root's live release and its schedules; None when nothing is live or the service is
/// stopped (the clock pauses).
fn live(root: &Root) -> Option<Live> {
    if is_stopped(root) {
        return None;
    }
    kept(root)
}

pub(crate) use crate::engine::schedule_status::{is_stopped, kept_schedules as kept};

/// Whether the root has schedules to keep (a live, running service whose policy names some).
pub fn has_schedules(root: &Root) -> bool {
    live(root).is_some_and(|live| !live.schedules.is_empty())
}

pub(crate) use crate::host::schedule_book::keeper_lock as lock_path;

/// Starts the root's clock keeper unless one runs or there is nothing to keep: its pid when
/// one was started ([`said`] gives the words for a report).
pub async fn ensure(root: &Root) -> Option<std::io::Result<u32>> {
    if !has_schedules(root) || !keeper_gone(&lock_path(&root.0)).await {
        return None;
    }
    let args = [
        KEEP_CLOCK_COMMAND.as_ref(),
        "--root".as_ref(),
        root.0.as_os_str(),
    ];
    let mut command = crate::host::daemon::command(args, &root.0, || Ok(()));
    command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    Some(command.spawn().map(|child| child.id().unwrap_or_default()))
}

/// Whether no keeper holds the clock: the lock is free, or its holder is on its way out (killed
/// a moment ago: found as `up` right after a `kill -9` saw the lock still held, and started
/// nothing) and lets go of it within a moment.
async fn keeper_gone(lock: &std::path::Path) -> bool {
    use crate::host::lock;
    let holder = std::fs::read_to_string(lock)
        .ok()
        .and_then(|text| text.trim().parse::<i32>().ok());
    let lock = lock.to_path_buf();
    let free = move || {
        crate::host::daemon::unless_held_by_a_live_one(holder, (), |()| {
            lock::is_free(&lock).then_some(()).ok_or(())
        })
    };
    tokio::task::spawn_blocking(free)
        .await
        .is_ok_and(|free| free.is_ok())
}

/// What [`ensure`] did, in words.
pub fn said(started: &std::io::Result<u32>) -> String {
    match started {
        Ok(pid) => format!("the schedules: kept by a clock keeper (pid {pid})"),
        Err(e) => format!("the schedules: no clock keeper could start: {e}"),
    }
}

/// `rollgate keep-clock --root ROOT`.
pub fn keep_clock(root: PathBuf) -> Result<u8, Error> {
    let root = Root::existing(root)?;
    std::fs::create_dir_all(root.0.join(crate::host::keeper::KEEPERS_DIR))
        .map_err(|e| Error::Failed(format!("cannot make the keepers' folder: {e}")))?;
    let _held = match crate::host::lock::acquire(&lock_path(&root.0)) {
        Ok(held) => held,
        // Another keeper keeps this clock.
        Err(Fault::Busy { .. }) => return Ok(0),
        Err(e) => return Err(e.into()),
    };
    crate::engine::runtime()?.block_on(keep(&root));
    Ok(0)
}

async fn keep(root: &Root) {
    let mut runs = tokio::task::JoinSet::new();
    let mut first = true;
    while let Some(live) = live(root).filter(|l| !l.schedules.is_empty()) {
        if first {
            first = false;
            for why in &live.refused {
                log(
                    root,
                    &live,
                    LogEvent::ScheduleSkipped,
                    None,
                    None,
                    format!("cannot run: {why}"),
                );
            }
            adopt_left(root, &live, &mut runs);
            say_missed(root, &live, &mut runs).await;
        }
        let now = journal::now();
        for schedule in &live.schedules {
            let last = last_due(root, &schedule.name).unwrap_or(now - SLACK);
            if let Some(due) = schedule.next_after(last).filter(|due| *due <= now) {
                take(root, &live, schedule, due, false, &mut runs).await;
            }
        }
        while runs.try_join_next().is_some() {}
        let now = journal::now();
        let next = live
            .schedules
            .iter()
            .filter_map(|s| s.next_after(last_due(root, &s.name).unwrap_or(now - SLACK)))
            .fold(now + LOOK_AGAIN, f64::min);
        tokio::time::sleep(Duration::from_secs_f64((next - now).clamp(0.0, LOOK_AGAIN))).await;
    }
    // Paused or ended: the runs going finish first (they are this keeper's to record).
    while runs.join_next().await.is_some() {}
}

fn last_due(root: &Root, name: &str) -> Option<f64> {
    Book::read(&root.0)
        .ok()?
        .schedules
        .get(name)
        .and_then(|t| t.last_due)
}

/// Takes `due` for `schedule` in the book and acts on it: skipped, or started (the runs going
/// stopped first under `'replace`).
async fn take(
    root: &Root,
    live: &Live,
    schedule: &Schedule,
    due: f64,
    caught_up: bool,
    runs: &mut tokio::task::JoinSet<()>,
) {
    let token = format!("sched-{}-{}", schedule.name, (due * 1000.0) as u64);
    let decided = Book::change(&root.0, |book| {
        let taken = book.schedules.entry(schedule.name.clone()).or_default();
        if taken.last_due.is_some_and(|last| last >= due) {
            return (false, None);
        }
        taken.last_due = Some(due);
        let (going, starting) = going(&taken.running);
        let decision = at_due(schedule, going.len() + starting);
        if !matches!(decision, AtDue::Skip(_)) {
            taken
                .running
                .push(running(live, Some(due), &token, schedule.timeout_ms));
        }
        (true, Some((decision, going)))
    });
    // A book that cannot be changed skips the due time, as the concurrency rule may.
    let (decision, going) = match decided {
        Ok(Some(decided)) => decided,
        Ok(None) => return,
        Err(e) => (AtDue::Skip(format!("not run: {e}")), Vec::new()),
    };
    match decision {
        AtDue::Skip(why) => log(
            root,
            live,
            LogEvent::ScheduleSkipped,
            Some(schedule),
            Some(due),
            why,
        ),
        AtDue::ReplaceThenStart => {
            for who in going {
                crate::host::process::stop_group(who, RUN_GRACE).await;
            }
            start(root, live, schedule, (Some(due), caught_up), token, runs);
        }
        AtDue::Start => start(root, live, schedule, (Some(due), caught_up), token, runs),
    }
}

/// The runs of a schedule that are going: those whose process runs, and how many more are
/// being started (their pid not written yet) by a keeper that still runs. One whose keeper
/// died as it started it is going only if its process began (found by its token): a clock
/// killed right after it took a due time left such an entry, which its next keeper removes —
/// counted until then, it made the next keeper skip the due time it was to catch up ("the last
/// run still runs") under `'forbid`.
fn going(runs: &[Running]) -> (Vec<Identity>, usize) {
    let me = std::process::id() as i32;
    let mut going: Vec<Identity> = runs
        .iter()
        .filter(|r| r.pid > 0 && r.identity().is_running())
        .map(Running::identity)
        .collect();
    let mut starting = 0;
    for run in runs.iter().filter(|r| r.pid == 0) {
        if run.waiter == me || is_rollgate(run.waiter) {
            starting += 1;
        } else {
            going.extend(crate::host::process::find_by_token(&run.token));
        }
    }
    (going, starting)
}

/// Ends every scheduled run of the root that is going (a stopped service runs nothing, its
/// schedules' runs included): each whole tree, SIGTERM then `grace` then killed. A run being
/// started as the stop began (its pid not in the book yet) is waited for a moment and ended
/// too. The words name each run ended.
pub async fn stop_runs(root: &Root, grace: Duration) -> Vec<String> {
    let mut said = Vec::new();
    let until = tokio::time::Instant::now() + Duration::from_secs(3);
    loop {
        let book = Book::read(&root.0).unwrap_or_default();
        let mut starting = false;
        for (name, taken) in &book.schedules {
            for run in &taken.running {
                // Being started by a keeper that still runs (a dead one's never starts).
                starting |= run.pid == 0 && is_rollgate(run.waiter);
                if run.pid > 0 && run.identity().is_running() {
                    let how = crate::host::process::stop_group(run.identity(), grace).await;
                    said.push(format!("schedule {name}'s run (pid {}) {how}", run.pid));
                }
            }
        }
        if !starting || tokio::time::Instant::now() >= until {
            return said;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A run as the book holds it before its process exists.
pub(crate) fn running(live: &Live, due: Option<f64>, token: &str, timeout_ms: u64) -> Running {
    let now = journal::now();
    Running {
        due,
        version: live.version.clone(),
        token: token.to_string(),
        pid: 0,
        start_time: 0,
        started_at: now,
        deadline: now + timeout_ms as f64 / 1000.0,
        waiter: std::process::id() as i32,
    }
}

/// The runs of a schedule whose output is kept (the oldest go as a new one starts).
const RUNS_KEPT: usize = 10;

/// Where a schedule's runs' output is kept: a file per run, `STARTED_MS-TOKEN.output`, so two
/// runs (`'allow`) never share one, and the names sort by start.
pub fn outputs_dir(root: &Root, name: &str) -> PathBuf {
    root.0.join("schedules").join(name)
}

/// The kept runs' output files of a schedule, oldest first.
pub fn outputs(root: &Root, name: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(outputs_dir(root, name))
        .map(|dir| {
            dir.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "output"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

/// A new run's output file, the oldest runs' removed past [`RUNS_KEPT`].
fn new_output(root: &Root, name: &str, token: &str) -> Result<PathBuf, String> {
    let folder = outputs_dir(root, name);
    std::fs::create_dir_all(&folder)
        .map_err(|e| format!("cannot make {}: {e}", folder.display()))?;
    let kept = outputs(root, name);
    for old in kept.iter().take((kept.len() + 1).saturating_sub(RUNS_KEPT)) {
        let _ = std::fs::remove_file(old);
    }
    let started = (journal::now() * 1000.0) as u64;
    Ok(folder.join(format!("{started:015}-{token}.output")))
}

/// Starts the run (its line once it runs), waited for in `runs`.
fn start(
    root: &Root,
    live: &Live,
    schedule: &Schedule,
    (due, caught_up): (Option<f64>, bool),
    token: String,
    runs: &mut tokio::task::JoinSet<()>,
) {
    let (root, live_facts, schedule) = (root.clone(), facts(live), schedule.clone());
    runs.spawn(async move {
        let ended = run(&root, &live_facts, &schedule, (due, caught_up), &token).await;
        finish(&root, &live_facts, &schedule, due, &token, &ended);
    });
}

/// What a run needs of the live release (owned, for its task).
fn facts(live: &Live) -> Live {
    Live {
        service: live.service.clone(),
        version: live.version.clone(),
        launch: live.launch.clone(),
        schedules: Vec::new(),
        refused: Vec::new(),
    }
}

/// How a run ended.
pub(crate) struct RunEnd {
    pub(crate) words: String,
    /// Its exit status as a shell gives it.
    pub(crate) code: i32,
    /// Exit status 0 within its time limit.
    pub(crate) ok: bool,
    pub(crate) took_ms: u64,
}

/// Runs it to its end, or says why it could not start; `due` is its due time (none: run now)
/// and whether it is one caught up after the clock was down.
pub(crate) async fn run(
    root: &Root,
    live: &Live,
    schedule: &Schedule,
    (due, caught_up): (Option<f64>, bool),
    token: &str,
) -> Result<RunEnd, String> {
    let output = new_output(root, &schedule.name, token)?;
    let one_off = crate::host::one_off::OneOff {
        root: &root.0,
        service: &live.service,
        version: &live.version,
        command: &schedule.command,
        record: &live.launch,
    };
    let to = crate::host::one_off::ToFile {
        output: &output,
        token,
        limit: Duration::from_millis(schedule.timeout_ms),
        grace: RUN_GRACE,
        env: vec![("ROLLGATE_SCHEDULE".to_string(), schedule.name.clone())],
    };
    let spawned = |who: Identity| {
        let _ = Book::change(&root.0, |book| {
            let taken = book.schedules.entry(schedule.name.clone()).or_default();
            let Some(run) = taken.running.iter_mut().find(|r| r.token == token) else {
                return (false, ());
            };
            run.pid = who.pid;
            run.start_time = who.start_time;
            (true, ())
        });
        // A start past its due time says how late; one caught up after the clock was down says
        // so too — only that one (a run merely late on a loaded host was called caught up).
        let late = due
            .map(|due| journal::now() - due)
            .filter(|late| caught_up || *late > SLACK)
            .map_or(String::new(), |late| match caught_up {
                true => format!("; {late:.1} s after its due time (caught up)"),
                false => format!("; {late:.1} s after its due time"),
            });
        let detail = format!(
            "{} `{}` started in {} (pid {}){late}",
            schedule.name,
            crate::host::output::printable(&schedule.command.join(" ")),
            live.version,
            who.pid
        );
        let entry = Entry {
            pid: Some(who.pid),
            ..entry(
                live,
                LogEvent::ScheduleStarted,
                Some(&schedule.name),
                due,
                detail,
            )
        };
        super::say(root, &entry);
    };
    let ended = crate::host::one_off::run_to_file(&one_off, &to, spawned)
        .await
        .map_err(|e| e.to_string())?;
    Ok(RunEnd {
        words: match ended.timed_out {
            true => format!("stopped at its time limit ({} ms)", schedule.timeout_ms),
            false => ended.ended.words(),
        },
        code: ended.ended.code,
        ok: ended.ended.code == 0 && !ended.timed_out,
        took_ms: ended.ended.took.as_millis() as u64,
    })
}

/// The run's end in the book and the log.
pub(crate) fn finish(
    root: &Root,
    live: &Live,
    schedule: &Schedule,
    due: Option<f64>,
    token: &str,
    ended: &Result<RunEnd, String>,
) {
    let (words, ok, took) = match ended {
        Ok(end) => (end.words.clone(), end.ok, end.took_ms),
        Err(why) => (format!("could not start: {why}"), false, 0),
    };
    let _ = Book::change(&root.0, |book| {
        let taken = book.schedules.entry(schedule.name.clone()).or_default();
        taken.running.retain(|r| r.token != token);
        taken.last = Some(Ended {
            due,
            version: live.version.clone(),
            ok,
            words: words.clone(),
            finished_at: journal::now(),
            took_ms: took,
        });
        (true, ())
    });
    let event = match ended {
        Ok(_) => LogEvent::ScheduleFinished,
        // It never ran: the due time's one line says so.
        Err(_) => LogEvent::ScheduleSkipped,
    };
    let entry_detail = format!(
        "{}: {words} after {took} ms, in {}",
        schedule.name, live.version
    );
    let entry = Entry {
        elapsed_ms: Some(took),
        ok: Some(ok),
        ..entry(live, event, Some(&schedule.name), due, entry_detail)
    };
    super::say(root, &entry);
}

/// The runs a keeper before this one left: waited for (their exit status is lost with their
/// keeper), or recorded as ended; a run being waited for by a live `schedules run` is its own.
fn adopt_left(root: &Root, live: &Live, runs: &mut tokio::task::JoinSet<()>) {
    let me = std::process::id() as i32;
    let left: Vec<(String, Running)> = Book::read(&root.0)
        .map(|book| {
            book.schedules
                .into_iter()
                .flat_map(|(name, taken)| taken.running.into_iter().map(move |r| (name.clone(), r)))
                .collect()
        })
        .unwrap_or_default();
    for (name, run) in left {
        if run.waiter != me && is_rollgate(run.waiter) {
            continue;
        }
        let who = match run.pid {
            0 => crate::host::process::find_by_token(&run.token)
                .into_iter()
                .next(),
            _ => Some(run.identity()).filter(|who| who.is_running()),
        };
        let schedule = live.schedules.iter().find(|s| s.name == name).cloned();
        let (root, facts) = (root.clone(), facts(live));
        runs.spawn(async move {
            // A due time taken whose run never began is a skipped one (its line the due time's
            // only one), never a run started again: at most one start per due time.
            let (event, words) = match who {
                Some(who) => {
                    wait_adopted(who, run.deadline).await;
                    let words = "ended; its exit status went with the keeper that started it";
                    (LogEvent::ScheduleFinished, words)
                }
                None if run.pid == 0 => (
                    LogEvent::ScheduleSkipped,
                    "did not run: its keeper died as it started it",
                ),
                None => (
                    LogEvent::ScheduleFinished,
                    "ended while nothing kept the clock; its exit status is not known",
                ),
            };
            let name = schedule.map_or(name, |s| s.name);
            finish_adopted(&root, &facts, &name, &run, event, words.to_string());
        });
    }
}

/// Waits for a run it did not start, stopping it at its deadline.
async fn wait_adopted(who: Identity, deadline: f64) {
    while who.is_running() {
        if journal::now() >= deadline {
            crate::host::process::stop_group(who, RUN_GRACE).await;
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether `pid` is a rollgate (the same program as this one) that runs now.
fn is_rollgate(pid: i32) -> bool {
    let exe = |pid: &str| std::fs::read_link(format!("/proc/{pid}/exe")).ok();
    pid > 0 && exe(&pid.to_string()).is_some_and(|e| Some(e) == exe("self"))
}

fn finish_adopted(
    root: &Root,
    live: &Live,
    name: &str,
    run: &Running,
    event: LogEvent,
    words: String,
) {
    let took = ((journal::now() - run.started_at) * 1000.0).max(0.0) as u64;
    let _ = Book::change(&root.0, |book| {
        let taken = book.schedules.entry(name.to_string()).or_default();
        taken.running.retain(|r| r.token != run.token);
        taken.last = Some(Ended {
            due: run.due,
            version: run.version.clone(),
            ok: false,
            words: words.clone(),
            finished_at: journal::now(),
            took_ms: took,
        });
        (true, ())
    });
    let live = Live {
        version: run.version.clone(),
        ..facts(live)
    };
    let detail = format!("{name}: {words}, in {}", run.version);
    let entry = Entry {
        elapsed_ms: Some(took),
        ..entry(&live, event, Some(name), run.due, detail)
    };
    super::say(root, &entry);
}

/// The due times that passed while nothing kept the clock: said once per schedule (how many,
/// and the last of them), each counted once — with `catch_up = 'last` the latest is not among
/// them: it is taken now, as a due time is (its start says it is late). A schedule never seen
/// before starts from now.
async fn say_missed(root: &Root, live: &Live, runs: &mut tokio::task::JoinSet<()>) {
    let now = journal::now();
    for schedule in &live.schedules {
        let catch_up = schedule.catch_up == crate::policy::CatchUp::Last;
        let found = Book::change(&root.0, |book| {
            let taken = book.schedules.entry(schedule.name.clone()).or_default();
            let Some(last) = taken.last_due else {
                taken.last_due = Some(now - SLACK);
                return (true, None);
            };
            let (count, latest) = schedule.due_between(last, now - SLACK, 10_000);
            let Some(latest) = latest else {
                return (false, None);
            };
            // Said missed: all of them, or all but the latest that is caught up.
            let (said, said_last) = match catch_up {
                false => (count, Some(latest)),
                true => {
                    let (before, last_before) = schedule.due_between(last, latest - 0.001, 10_000);
                    (before, last_before)
                }
            };
            if let Some(said_last) = said_last {
                taken.last_due = Some(said_last);
            }
            (true, Some((said, said_last, latest)))
        });
        let Ok(Some((said, said_last, latest))) = found else {
            continue;
        };
        if let Some(said_last) = said_last.filter(|_| said > 0) {
            let detail = format!(
                "{}: {said} due time(s) passed while nothing kept the clock (the last at {}){}",
                schedule.name,
                chrono::DateTime::<chrono::Utc>::from_timestamp(said_last as i64, 0)
                    .map_or(said_last.to_string(), |t| t
                        .format("%Y-%m-%d %H:%M:%S UTC")
                        .to_string()),
                match catch_up {
                    true => "; not run, and the one after them is run now (catch_up 'last)",
                    false => "; not run (catch_up 'none)",
                }
            );
            log(
                root,
                live,
                LogEvent::ScheduleMissed,
                Some(schedule),
                Some(said_last),
                detail,
            );
        }
        if catch_up {
            take(root, live, schedule, latest, true, runs).await;
        }
    }
}

fn entry<'a>(
    live: &'a Live,
    event: LogEvent,
    schedule: Option<&str>,
    due: Option<f64>,
    detail: String,
) -> Entry<'a> {
    Entry {
        schedule: schedule.map(str::to_string),
        due,
        ..Entry::new(event, &live.version, &live.service, detail)
    }
}

fn log(
    root: &Root,
    live: &Live,
    event: LogEvent,
    schedule: Option<&Schedule>,
    due: Option<f64>,
    detail: String,
) {
    super::say(
        root,
        &entry(live, event, schedule.map(|s| s.name.as_str()), due, detail),
    );
}
