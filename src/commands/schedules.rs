//! `rollgate schedules list` and `rollgate schedules run SVC NAME` (issue 70): what the clock
//! keeps — each schedule of the live release's policy, when it is due next, how its last run
//! went, what runs now — and a run now, by a person, under the schedule's own rules (its
//! release, confinement and limit; `'forbid` refuses while a run goes on, `'replace` stops it
//! first), its exit status rollgate's.

use crate::engine::clock::{at_due, AtDue, Schedule};
use crate::error::{refused, Error};
use crate::host::journal;
use crate::host::schedule_book::Book;
use crate::host::state::Root;
use crate::render::table::{Cell, Grid, Layout};
use crate::render::Format;
use crate::supervision::clock::{self, Live};

/// One schedule as `schedules list` shows it.
pub type Listed = crate::engine::schedule_status::ScheduleStatus;

/// `rollgate schedules list --root R`.
pub fn list(root: &std::path::Path, format: Format, layout: Layout) -> Result<String, Error> {
    let root = Root::existing(root.to_path_buf())?;
    let Some(live) = clock::kept(&root) else {
        return Err(refused(format!(
            "nothing is live under {}: its policy's schedules run in the live release",
            root.0.display()
        )));
    };
    let listed = listing(&root, &live)?;
    Ok(match format {
        Format::Json => listed
            .iter()
            .map(|l| serde_json::to_string(l).expect("a listing serializes") + "\n")
            .collect(),
        Format::Csv => {
            let mut out = String::from(
                "schedule,cron,state,next_due,running,last_result,last_ok,last_finished\n",
            );
            for l in &listed {
                out.push_str(&format!(
                    "{},{},{},{},{},{},{},{}\n",
                    l.schedule,
                    crate::render::csv_field(&l.cron),
                    crate::render::csv_field(&l.state),
                    l.next_due.map_or(String::new(), |t| format!("{t:.3}")),
                    l.running.len(),
                    crate::render::csv_field(l.last.as_ref().map_or("", |e| e.words.as_str())),
                    l.last.as_ref().map_or(String::new(), |e| e.ok.to_string()),
                    l.last
                        .as_ref()
                        .map_or(String::new(), |e| format!("{:.3}", e.finished_at)),
                ));
            }
            out
        }
        Format::Table => table(&listed, &live, layout),
    })
}

fn listing(root: &Root, live: &Live) -> Result<Vec<Listed>, Error> {
    let book = Book::read(&root.0)?;
    Ok(crate::engine::schedule_status::schedules(
        root,
        live,
        &book,
        journal::now(),
    ))
}

fn table(listed: &[Listed], live: &Live, layout: Layout) -> String {
    if listed.is_empty() && live.refused.is_empty() {
        return format!(
            "no schedules in the policy of {} {}\n",
            live.service, live.version
        );
    }
    let mut grid = Grid::new(
        [
            "schedule", "cron", "state", "next", "last run", "result", "running", "command",
        ],
        &["schedule", "cron", "next", "last run", "result"],
    );
    for l in listed {
        let result = match &l.last {
            Some(last) if last.ok => {
                format!("ok: {} ({} ms, {})", last.words, last.took_ms, last.version)
            }
            Some(last) => format!(
                "FAILED: {} ({} ms, {})",
                last.words, last.took_ms, last.version
            ),
            None => "-".into(),
        };
        grid.push(vec![
            l.schedule.as_str().into(),
            l.cron.as_str().into(),
            l.state.as_str().into(),
            Cell::Time(l.next_due),
            Cell::Time(l.last.as_ref().map(|e| e.finished_at)),
            result.into(),
            match l.running.is_empty() {
                true => "-".to_string(),
                false => l
                    .running
                    .iter()
                    .map(|p| format!("pid {p}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            }
            .into(),
            crate::host::output::printable(&l.command.join(" ")).into(),
        ]);
    }
    let mut out = grid.render(layout);
    for why in &live.refused {
        out.push_str(&format!("not run: {why}\n"));
    }
    out
}

/// `rollgate schedules run SVC NAME --root R`: the run's exit status (0-255).
pub fn run_now(root: &std::path::Path, service: &str, name: &str) -> Result<u8, Error> {
    crate::host::names::check_name("service", service)?;
    crate::host::names::check_name("schedule", name)?;
    let root = Root::existing(root.to_path_buf())?;
    let live = clock::kept(&root)
        .filter(|live| live.service == service)
        .ok_or_else(|| {
            refused(format!(
                "nothing of {service} is live under {}: a schedule runs in the live release",
                root.0.display()
            ))
        })?;
    if clock::is_stopped(&root) {
        return Err(refused(format!(
            "{service} is stopped, and its schedules with it: `rollgate start {service}` first"
        )));
    }
    let schedule = find(&live, name)?;
    let token = format!("sched-{name}-now-{}", std::process::id());
    let decided = Book::change(&root.0, |book| {
        let taken = book.schedules.entry(name.to_string()).or_default();
        let going: Vec<_> = taken
            .running
            .iter()
            .filter(|r| r.pid > 0 && r.identity().is_running())
            .map(|r| r.identity())
            .collect();
        let starting = taken.running.iter().filter(|r| r.pid == 0).count();
        let decision = at_due(&schedule, going.len() + starting);
        if matches!(decision, AtDue::Skip(_)) {
            return (false, (decision, going));
        }
        taken
            .running
            .push(clock::running(&live, None, &token, schedule.timeout_ms));
        (true, (decision, going))
    })?;
    let (decision, going) = decided;
    if let AtDue::Skip(why) = decision {
        return Err(refused(format!("{name} not run: {why}")));
    }
    crate::engine::runtime()?.block_on(async {
        if decision == AtDue::ReplaceThenStart {
            for who in going {
                crate::host::process::stop_group(who, std::time::Duration::from_secs(5)).await;
            }
        }
        let ended = clock::run(&root, &live, &schedule, (None, false), &token).await;
        clock::finish(&root, &live, &schedule, None, &token, &ended);
        match ended {
            Ok(end) => {
                eprintln!(
                    "rollgate: {name} ran in {}: {} after {} ms; its output: `rollgate logs {service} --schedule {name}`",
                    live.version, end.words, end.took_ms,
                );
                Ok(u8::try_from(end.code).unwrap_or(u8::MAX))
            }
            Err(why) => Err(Error::Failed(format!("{name} could not start: {why}"))),
        }
    })
}

/// The live policy's schedule `name`, or what there is.
fn find(live: &Live, name: &str) -> Result<Schedule, Error> {
    if let Some(schedule) = live.schedules.iter().find(|s| s.name == name) {
        return Ok(schedule.clone());
    }
    let names: Vec<&str> = live.schedules.iter().map(|s| s.name.as_str()).collect();
    Err(refused(format!(
        "the policy of {} {} has no schedule {name} (its schedules: {})",
        live.service,
        live.version,
        match names.is_empty() {
            true => "none".to_string(),
            false => names.join(", "),
        }
    )))
}
