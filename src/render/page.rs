//! The console's page, rendered on the server from the same JSON its API answers (read into the
//! typed view of `page_model.rs`), so it reads without JavaScript (a `<noscript>` refresh keeps
//! it current); with JavaScript it follows the event stream and counts the deadlines down
//! between updates. Names nothing of rollgate: it renders values.

pub use super::page_model::Section;
use super::page_model::{
    CandidateView, LookView, OutcomeView, RolloutView, RootView, SlotView, TlsView,
};

/// Text made safe inside HTML (element content and quoted attributes).
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A value shown as text, "-" when there is none.
fn shown<T: std::fmt::Display>(value: Option<T>) -> String {
    value.map_or("-".into(), |v| v.to_string())
}

fn seconds(value: Option<f64>) -> String {
    value.map_or("-".into(), |s| format!("{:.0} s", s.max(0.0)))
}

const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:0;background:#f5f6f8;color:#1d2330}\
header{background:#1d2330;color:#fff;padding:10px 20px}header h1{font-size:18px;margin:0}\
main{padding:12px 20px}section{background:#fff;border:1px solid #d8dce3;border-radius:6px;margin:0 0 16px;padding:12px 16px}\
h2{font-size:16px;margin:0 0 8px}h3{font-size:14px;margin:12px 0 6px}table{border-collapse:collapse;width:100%}\
td,th{border-bottom:1px solid #eceef2;padding:3px 6px;text-align:left;font-variant-numeric:tabular-nums}\
.bar{background:#e6e9ef;border-radius:3px;height:12px;width:240px;display:inline-block;vertical-align:middle;overflow:hidden}\
.bar span{display:inline-block;height:100%;vertical-align:top}.bar .moved{background:#2f7d4f}.bar .failed{background:#b3261e}\
tr.current td:first-child{font-weight:600}tr.current td:first-child::after{content:\" ◀\";color:#8b93a1}\
.timeline text{font:11px system-ui,sans-serif;fill:#1d2330}.timeline .axis text{fill:#5b6472}.bad{color:#b3261e}.good{color:#2f7d4f}.warn{color:#9a6700}\
.required{font-weight:600}.banner{background:#fff4e5;border:1px solid #f0c36d;padding:6px 10px;border-radius:4px;margin:6px 0}\
form{display:inline-block;margin:4px 8px 4px 0}button{padding:4px 12px;border-radius:4px;border:1px solid #8b93a1;background:#fff;cursor:pointer}\
button.danger{border-color:#b3261e;color:#b3261e}.traffic.maintenance b{color:#b3261e}.traffic.paused b{color:#a15c00}.said{background:#e8f0fe;border:1px solid #a8c7fa;padding:6px 10px;border-radius:4px}\
table.analysis caption{text-align:left;font-weight:600}.verdict.fail{color:#b3261e}.verdict.pass{color:#2f7d4f}.verdict.inconclusive{color:#9a6700}";

/// The whole page: a section per root, buttons only when `actions` is true.
pub fn page(
    sections: &[Section],
    read_only: bool,
    actions: bool,
    now: f64,
    said: Option<&str>,
) -> String {
    let mut html = String::new();
    html.push_str("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">");
    html.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">");
    html.push_str("<title>rollgate console</title>");
    html.push_str("<noscript><meta http-equiv=\"refresh\" content=\"5\"></noscript>");
    html.push_str(&format!("<style>{STYLE}</style></head><body>"));
    html.push_str(&format!(
        "<header><h1>rollgate console</h1><small>{} root{}{}</small></header><main id=\"main\" data-now=\"{now}\">",
        sections.len(),
        if sections.len() == 1 { "" } else { "s" },
        match (read_only, actions) {
            (true, _) => " · read-only",
            (false, true) => "",
            (false, false) => " · open the link the console printed to act",
        }
    ));
    if let Some(said) = said {
        html.push_str(&format!(
            "<p class=\"said\" id=\"said\">{}</p>",
            escape(said)
        ));
    }
    for section in sections {
        html.push_str(&root_section(section, actions));
    }
    html.push_str("</main>");
    html.push_str(SCRIPT);
    html.push_str("</body></html>");
    html
}

fn root_section(section: &Section, actions: bool) -> String {
    let state = &section.state;
    let id = escape(&state.service);
    let mut html = format!("<section id=\"root-{id}\" data-service=\"{id}\"><h2>{id}</h2>");
    html.push_str(&format!(
        "<p class=\"root\">root <code>{}</code></p>",
        escape(&state.root)
    ));
    if let Some(why) = &section.unreadable {
        html.push_str(&format!("<p class=\"bad unreadable\">{}</p>", escape(why)));
    }
    html.push_str(&live(state));
    if let Some(candidate) = &state.candidate {
        html.push_str(&escalated(&state.service, candidate, actions));
    }
    if let Some(tls) = &state.tls {
        html.push_str(&certificates(tls));
    }
    html.push_str(&traffic(state, actions));
    if let Some(rollout) = &state.rollout {
        html.push_str(&rollout_block(&state.service, rollout, actions));
    }
    html.push_str(&history(&section.history));
    html.push_str("</section>");
    html
}

/// Whether its keeper runs, and its restarts since it went live, as `status` says them.
fn kept(live: &super::page_model::LiveView) -> String {
    let Some(kept) = live.kept else {
        return String::new();
    };
    let r = &live.restarts;
    let restarts = match (r.count, r.last_at) {
        (0, _) | (_, None) => "none since it went live".to_string(),
        (n, Some(at)) => format!(
            "{n} since it went live (last at {}: {})",
            super::time::format_time(at),
            r.last_ended
                .as_deref()
                .unwrap_or("not running at `rollgate up`")
        ),
    };
    format!(
        "<p class=\"kept\">restarts: {} · <span class=\"{}\">{}</span></p>",
        escape(&restarts),
        if kept { "good" } else { "bad" },
        if kept {
            "kept (started again if it exits)"
        } else {
            "NOT kept: nothing starts it again if it exits"
        }
    )
}

fn live(state: &RootView) -> String {
    let mut html = String::from("<h3>Live release</h3>");
    if let Some(stopped) = &state.stopped {
        html.push_str(&format!(
            "<p class=\"stopped bad\">STOPPED by {}{}{} · nothing starts it until <code>rollgate start {}</code></p>",
            escape(&stopped.by),
            stopped.since.map_or(String::new(), |t| format!(" at {}", escape(&super::time::format_time(t)))),
            stopped.why.as_deref().map_or(String::new(), |w| format!(" ({})", escape(w))),
            escape(&state.service)
        ));
    }
    match &state.live {
        None => html.push_str("<p class=\"live\">nothing promoted yet</p>"),
        Some(live) => html.push_str(&format!(
            "<p class=\"live\"><b class=\"version\">{}</b> on port {} (pid {}), live for {} · <span class=\"{}\">{}</span></p>",
            escape(&live.version),
            shown(live.port),
            shown(live.pid),
            seconds(live.live_for_s),
            if live.answering { "good" } else { "bad" },
            if live.answering { "answering" } else { "not answering" }
        )),
    }
    if let Some((live, confined)) = state.live.as_ref().and_then(|l| Some((l, l.confined?))) {
        let words = super::confinement::words(&super::confinement::Held {
            confined,
            uid: live.uid,
            own_user: live.own_user,
            tree: live.tree.as_deref(),
            limits: live.limits,
        });
        html.push_str(&format!(
            "<p class=\"held\">confined: <span class=\"{}\">{}</span></p>",
            if confined { "good" } else { "bad" },
            escape(&words)
        ));
    }
    if let Some(live) = &state.live {
        html.push_str(&kept(live));
    }
    if let Some(replicas) = &state.replicas {
        html.push_str("<table class=\"replicas\"><tr><th>slot</th><th>version</th><th>port</th><th>pid</th><th>up for</th><th>answering</th><th>class</th></tr>");
        for replica in replicas {
            html.push_str(&format!(
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"{}\">{}</td><td>{}</td></tr>",
                shown(replica.slot),
                escape(&replica.version),
                shown(replica.port),
                shown(replica.pid),
                seconds(replica.up_for_s),
                if replica.answering == Some(true) { "good" } else { "bad" },
                match replica.answering {
                    Some(true) => "yes",
                    Some(false) => "no",
                    None => "-",
                },
                escape(&replica.class),
            ));
        }
        html.push_str("</table>");
    }
    html.push_str(&processes(&state.processes));
    html.push_str(&schedules(&state.schedules));
    html
}

/// The policy's schedules: a row each (when next, its last run and how it went — a failed one
/// in red — and the runs going).
fn schedules(schedules: &[super::page_model::ScheduleView]) -> String {
    if schedules.is_empty() {
        return String::new();
    }
    let at = |t: Option<f64>| t.map_or("-".into(), |t| format!("{} {} UTC", day(t), clock(t)));
    let mut html = String::from(
        "<h3>Schedules</h3><table class=\"schedules\"><tr><th>schedule</th><th>when</th><th>state</th><th>next</th><th>last run</th><th>result</th><th>running</th></tr>",
    );
    for s in schedules {
        let (class, result) = match &s.last {
            Some(last) if last.ok => (
                "good",
                format!("ok: {} ({} ms, {})", last.words, last.took_ms, last.version),
            ),
            Some(last) => (
                "bad",
                format!(
                    "FAILED: {} ({} ms, {})",
                    last.words, last.took_ms, last.version
                ),
            ),
            None => ("", "-".to_string()),
        };
        html.push_str(&format!(
            "<tr data-schedule=\"{name}\"><td>{name}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td class=\"{class}\">{}</td><td>{}</td></tr>",
            escape(&s.cron),
            escape(&s.state),
            at(s.next_due),
            at(s.last.as_ref().and_then(|l| l.finished_at)),
            escape(&result),
            match s.running.is_empty() {
                true => "-".to_string(),
                false => s.running.iter().map(|p| format!("pid {p}")).collect::<Vec<_>>().join(", "),
            },
            name = escape(&s.schedule),
        ));
    }
    html.push_str("</table>");
    html
}

/// The release's other types: a row per process (its type and place, pid, uptime, restarts,
/// what its type runs).
fn processes(processes: &[super::page_model::ProcessView]) -> String {
    if processes.is_empty() {
        return String::new();
    }
    let mut html = String::from(
        "<table class=\"processes\"><tr><th>process</th><th>version</th><th>pid</th><th>up for</th><th>running</th><th>restarts</th><th>runs</th></tr>",
    );
    for p in processes {
        html.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"{}\">{}</td><td>{}</td><td><code>{}</code></td></tr>",
            escape(&p.process),
            escape(&p.version),
            shown(p.pid),
            seconds(p.up_for_s.filter(|_| p.running)),
            if p.running { "good" } else { "bad" },
            if p.running { "yes" } else { "NO" },
            p.restarts.count,
            escape(p.command.as_deref().unwrap_or("-")),
        ));
    }
    html.push_str("</table>");
    html
}

/// The proxy's certificates: name, issuer, expiry (with the time left), source; and whether
/// its last reload took the files.
fn certificates(tls: &TlsView) -> String {
    let mut html = String::from("<h3>Certificates</h3><table class=\"certificates\"><tr><th>name</th><th>issuer</th><th>expires</th><th>source</th></tr>");
    for cert in &tls.certificates {
        html.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{} UTC</td><td>{}</td></tr>",
            escape(&cert.name),
            escape(&cert.issuer),
            cert.not_after
                .map_or("-".into(), |at| format!("{} {}", day(at), clock(at))),
            escape(&cert.source),
        ));
    }
    html.push_str("</table>");
    if let Some(reload) = &tls.last_reload {
        let at = reload
            .at
            .map_or("-".into(), |at| format!("{} {}", day(at), clock(at)));
        html.push_str(&match &reload.refused {
            None => format!("<p class=\"reload good\">read again at {at} UTC: taken</p>"),
            Some(why) => format!(
                "<p class=\"reload bad\">read again at {at} UTC: not taken, the ones before go on: {}</p>",
                escape(why)
            ),
        });
    }
    html
}

/// What users get through the proxy (`rollgate traffic`), its routes, and the buttons.
fn traffic(state: &RootView, actions: bool) -> String {
    let mut html = String::from("<h3>Traffic</h3>");
    let mode = state
        .traffic
        .as_ref()
        .map_or("serving", |t| t.mode.as_str());
    match state.traffic.as_ref().filter(|t| t.mode != "serving") {
        None => html.push_str("<p class=\"traffic serving\">serving</p>"),
        Some(t) => html.push_str(&format!(
            "<p class=\"traffic {}\"><b>{}</b>{} since {} {} UTC by {}{}</p>",
            escape(&t.mode),
            escape(&t.mode),
            t.message.as_deref().map_or(String::new(), |m| format!(
                " (\u{201c}{}\u{201d})",
                escape(m)
            )),
            t.since.map_or("-".into(), day),
            t.since.map_or("-".into(), clock),
            escape(&t.by),
            t.why
                .as_deref()
                .map_or(String::new(), |w| format!(": {}", escape(w))),
        )),
    }
    if let Some(routes) = state.routes.as_ref().filter(|r| !r.is_empty()) {
        html.push_str("<ul class=\"routes\">");
        for route in routes {
            html.push_str(&format!("<li>{}</li>", escape(route)));
        }
        html.push_str("</ul>");
    }
    if actions {
        if mode == "serving" {
            html.push_str(&button(
                &state.service,
                "traffic/maintenance",
                "Maintenance",
                true,
                "<input name=\"message\" placeholder=\"message to users\"> ",
            ));
            html.push_str(&button(
                &state.service,
                "traffic/pause",
                "Pause traffic",
                false,
                "",
            ));
        } else {
            html.push_str(&button(
                &state.service,
                "traffic/resume",
                "Resume traffic",
                false,
                "",
            ));
        }
    }
    html
}

fn button(service: &str, path: &str, label: &str, danger: bool, extra: &str) -> String {
    format!(
        "<form method=\"post\" action=\"/api/v1/roots/{}/{path}\">{extra}<button type=\"submit\"{} data-action=\"{path}\">{label}</button></form>",
        escape(service),
        if danger { " class=\"danger\"" } else { "" },
    )
}

fn escalated(service: &str, candidate: &CandidateView, actions: bool) -> String {
    let mut html = format!(
        "<h3>Deploy in flight</h3><p class=\"candidate\">candidate <b>{}</b> on port {} (pid {}): {}, waiting <span class=\"elapsed\" data-since=\"{}\">{}</span></p>",
        escape(&candidate.version),
        shown(candidate.port),
        shown(candidate.pid),
        escape(&candidate.stage),
        shown(candidate.started_at),
        seconds(candidate.waiting_s),
    );
    if candidate.orphaned {
        html.push_str(&format!(
            "<p class=\"orphaned\">Its deployer (pid {}) is gone: the next deploy, rollback or <code>rollgate up</code> finishes it.</p>",
            shown(candidate.deployer_pid),
        ));
    }
    if candidate.stage == "escalated" && actions {
        html.push_str(&button(service, "promote", "Promote", false, ""));
        html.push_str(&button(service, "abort", "Abort", true, ""));
    }
    html
}

/// The traffic judge's last look: canary and baseline side by side, and the verdict.
fn analysis_table(look: &LookView) -> String {
    let number = |value: Option<f64>, digits: usize| {
        value.map_or("-".to_string(), |v| format!("{v:.digits$}"))
    };
    let row = |release: &str,
               requests: Option<f64>,
               errors: Option<f64>,
               rate: Option<f64>,
               latency: Option<f64>| {
        format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{} %</td><td>{} ms</td></tr>",
            escape(release),
            number(requests, 0),
            number(errors, 0),
            number(rate, 2),
            number(latency, 2)
        )
    };
    let verdict = escape(&look.verdict);
    format!(
        "<table class=\"analysis\"><caption>analysis: <span class=\"verdict {verdict}\">{verdict}</span></caption><tr><th>release</th><th>requests</th><th>errors</th><th>error rate</th><th>latency (quantile)</th></tr>{}{}</table><p class=\"analysis-words\">{}</p>",
        row(
            &look.canary,
            look.canary_requests,
            look.canary_errors,
            look.canary_error_pct,
            look.canary_latency_ms
        ),
        row(
            &look.baseline,
            look.baseline_requests,
            look.baseline_errors,
            look.baseline_error_pct,
            look.baseline_latency_ms
        ),
        escape(&look.words),
    )
}

// Long on purpose: one block of HTML, in the order the page shows it (heading, reasons,
// countdowns, buttons, waves).
fn rollout_block(service: &str, rollout: &RolloutView, actions: bool) -> String {
    let state = rollout.state.as_str();
    let mut html = format!(
        "<h3>Rollout {} → {} <span class=\"state\">{}</span></h3>",
        escape(&shown(rollout.from.as_deref())),
        escape(&rollout.version),
        escape(state)
    );
    if let Some(left) = rollout.release_deadline_left_ms {
        html.push_str(&format!(
            "<p>release deadline in <span class=\"countdown\" data-left-ms=\"{left}\">{:.0} s</span></p>",
            left / 1000.0
        ));
    }
    if let Some(left) = rollout.soak_left_ms {
        html.push_str(&format!(
            "<p>soak ends in <span class=\"countdown soak\" data-left-ms=\"{left}\">{:.0} s</span></p>",
            left / 1000.0
        ));
    }
    if let Some(reason) = &rollout.pause_reason {
        html.push_str(&format!(
            "<p class=\"banner pause\">paused: {}</p>",
            escape(reason)
        ));
    }
    if let Some(look) = &rollout.analysis {
        html.push_str(&analysis_table(look));
    }
    if let Some(cause) = &rollout.abort_cause {
        // The slot only when the cause names one (an abort asked by a person names none).
        let slot = cause
            .slot
            .map_or(String::new(), |slot| format!("slot {slot}, "));
        html.push_str(&format!(
            "<p class=\"banner abort\">aborted: {} ({}{})</p>",
            escape(&cause.reason),
            slot,
            escape(&cause.phase),
        ));
    }
    if !rollout.required_waiting.is_empty() {
        let names: Vec<String> = rollout
            .required_waiting
            .iter()
            .map(u64::to_string)
            .collect();
        html.push_str(&format!(
            "<p class=\"required-waiting required\">required replicas still to confirm: {}</p>",
            names.join(", ")
        ));
    }
    let target = rollout.version.as_str();
    html.push_str(&waves_table(rollout, target));
    // Required replicas first, then the rest; failures say which version failed and why.
    let mut ordered: Vec<&SlotView> = rollout.slots.iter().collect();
    ordered.sort_by_key(|s| s.class != "required");
    html.push_str("<table class=\"slots\"><tr><th>slot</th><th>class</th><th>wave</th><th>state</th><th>serving</th><th>why</th></tr>");
    let wave_count = rollout.waves.len();
    for slot in ordered {
        let failed = slot.state == "failed";
        let why = slot.error.as_deref().unwrap_or("");
        // The error is the new version's (the slot serves its old one again after a failure).
        let why = match (why.is_empty(), failed) {
            (true, _) => String::new(),
            (false, true) => format!("{target} failed: {why}"),
            (false, false) => why.to_string(),
        };
        html.push_str(&format!(
            "<tr class=\"{}{}\"><td>{}</td><td>{}</td><td>{}</td><td class=\"{}\">{}</td><td>{}</td><td>{}</td></tr>",
            if slot.class == "required" { "required" } else { "" },
            if failed { " bad failure" } else { "" },
            shown(slot.slot),
            escape(&slot.class),
            slot.wave.map_or("-".into(), |w| wave_name(w, wave_count)),
            state_class(&slot.state),
            escape(&slot.state),
            escape(&shown(slot.version.as_deref())),
            escape(&why),
        ));
    }
    html.push_str("</table>");
    if actions {
        match state {
            "running" => html.push_str(&button(
                service,
                "rollout/pause",
                "Pause",
                false,
                "<input name=\"reason\" placeholder=\"reason\" maxlength=\"500\">",
            )),
            "paused" => html.push_str(&button(service, "rollout/resume", "Resume", false, "")),
            _ => {}
        }
        if matches!(state, "running" | "paused") {
            html.push_str(&button(
                service,
                "rollout/abort",
                "Abort with rollback",
                true,
                "<input type=\"hidden\" name=\"rollback\" value=\"true\"><input name=\"reason\" placeholder=\"reason\" maxlength=\"500\">",
            ));
        }
    }
    html
}

/// A wave as the CLI names it (`wave 1 of 4`: the log's index, as `rollout status` and the
/// pause reason say it).
fn wave_name(index: u64, count: usize) -> String {
    format!("wave {index} of {count}")
}

/// The colour a slot's state is read in: failures red, progress green, the rest plain.
fn state_class(state: &str) -> &'static str {
    match state {
        "failed" => "bad",
        "succeeded" => "good",
        "rolling_back" | "rolled_back" => "warn",
        _ => "",
    }
}

/// One row per wave: a bar whose green part is the replicas on the new version and whose red
/// part is the replicas that failed (never counted as progress), the counts in words, and the
/// current wave marked.
fn waves_table(rollout: &RolloutView, target: &str) -> String {
    let state_of = |slot: u64| {
        rollout
            .slots
            .iter()
            .find(|s| s.slot == Some(slot))
            .map_or("", |s| s.state.as_str())
    };
    let mut html = String::from(
        "<table class=\"waves\"><tr><th>wave</th><th>progress</th><th>replicas</th></tr>",
    );
    for (index, members) in rollout.waves.iter().enumerate() {
        let count = |wanted: &[&str]| {
            members
                .iter()
                .filter(|slot| wanted.contains(&state_of(**slot)))
                .count()
        };
        let moved = count(&["succeeded"]);
        let failed = count(&["failed"]);
        let other = count(&["left_behind", "removed", "rolled_back"]);
        let share = |n: usize| match members.len() {
            0 => 0.0,
            len => n as f64 * 100.0 / len as f64,
        };
        let mut words = vec![format!(
            "{moved} of {} on {}",
            members.len(),
            escape(target)
        )];
        if failed > 0 {
            words.push(format!("<span class=\"bad\">{failed} failed</span>"));
        }
        if other > 0 {
            words.push(format!("{other} not moved"));
        }
        let is_current = rollout.current_wave == Some(index as u64);
        html.push_str(&format!(
            "<tr class=\"wave{}\"><td>{}{}</td><td><span class=\"bar\"><span class=\"moved\" style=\"width:{:.0}%\"></span><span class=\"failed\" style=\"width:{:.0}%\"></span></span> {}</td><td>{}</td></tr>",
            if is_current { " current" } else { "" },
            wave_name(index as u64, rollout.waves.len()),
            if index == 0 { " (canary)" } else { "" },
            share(moved),
            share(failed),
            words.join(" · "),
            members.iter().map(|m| m.to_string()).collect::<Vec<_>>().join(" ")
        ));
    }
    html.push_str("</table>");
    html
}

fn history(outcomes: &[OutcomeView]) -> String {
    let mut html = String::from("<h3>History</h3>");
    html.push_str(&timeline(outcomes));
    // The gate's time is what an outcome line carries (`log history`'s time to outcome adds
    // the watch): the column says which it is.
    html.push_str("<table class=\"history\"><tr><th>when</th><th>outcome</th><th>version</th><th>gate took</th><th>reason</th><th>users had it</th></tr>");
    for outcome in outcomes.iter().rev() {
        let users = outcome.users_had_it.as_deref().unwrap_or("");
        html.push_str(&format!(
            "<tr class=\"outcome\"><td>{}</td><td class=\"{}\">{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"exposure\">{}</td></tr>",
            escape(&outcome.when),
            match outcome.event.as_str() {
                "promoted" => "good",
                "rolled_back" => "bad",
                _ => "warn",
            },
            escape(&outcome.event),
            escape(&outcome.version),
            outcome.elapsed_ms.map_or("-".into(), |ms| format!("{ms} ms")),
            escape(outcome.reason.as_deref().unwrap_or("")),
            escape(users),
        ));
    }
    html.push_str("</table>");
    html
}

/// Deploys and rollbacks along a time line with its axis, drawn here (readable without
/// JavaScript): each outcome a dot above the axis (promoted, green) or below it (rolled back,
/// red) labelled with its version and mark, five ticks with their clock times, the day (or the
/// days) under the axis, and a legend.
pub fn timeline(outcomes: &[OutcomeView]) -> String {
    const LEFT: f64 = 40.0;
    const WIDTH: f64 = 680.0;
    const AXIS: f64 = 62.0;
    let dated: Vec<(f64, &OutcomeView)> =
        outcomes.iter().filter_map(|o| Some((o.ts?, o))).collect();
    let (Some(first), Some(last)) = (
        dated.iter().map(|d| d.0).reduce(f64::min),
        dated.iter().map(|d| d.0).reduce(f64::max),
    ) else {
        return "<p class=\"empty\">no deploys yet</p>".into();
    };
    // One outcome (or all at one moment): the axis spans a minute around it.
    let (first, span) = match last - first {
        span if span < 1.0 => (first - 30.0, 60.0),
        span => (first, span),
    };
    let x_of = |ts: f64| LEFT + (ts - first) / span * WIDTH;
    let mut svg = format!(
        "<svg class=\"timeline\" role=\"img\" aria-label=\"deploys and rollbacks over time\" width=\"{w}\" height=\"112\" viewBox=\"0 0 {w} 112\" xmlns=\"http://www.w3.org/2000/svg\"><g class=\"axis\"><line x1=\"{LEFT}\" y1=\"{AXIS}\" x2=\"{}\" y2=\"{AXIS}\" stroke=\"#8b93a1\"/>",
        LEFT + WIDTH,
        w = LEFT * 2.0 + WIDTH,
    );
    let one_day = day(first) == day(first + span);
    for tick in 0..5 {
        let ts = first + span * f64::from(tick) / 4.0;
        let x = x_of(ts);
        let label = if one_day {
            clock(ts)
        } else {
            format!("{} {}", day(ts), clock(ts))
        };
        svg.push_str(&format!(
            "<line x1=\"{x:.1}\" y1=\"{AXIS}\" x2=\"{x:.1}\" y2=\"{}\" stroke=\"#8b93a1\"/><text class=\"tick\" x=\"{x:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            AXIS + 4.0,
            AXIS + 16.0,
            escape(&label)
        ));
    }
    let days = if one_day {
        format!("{} (UTC)", day(first))
    } else {
        format!("{} to {} (UTC)", day(first), day(first + span))
    };
    svg.push_str(&format!(
        "<text class=\"day\" x=\"{LEFT}\" y=\"{}\">{}</text><text class=\"legend\" x=\"{}\" y=\"{}\" text-anchor=\"end\"><tspan fill=\"#2f7d4f\">●</tspan> promoted ✓   <tspan fill=\"#b3261e\">●</tspan> rolled back ✗</text></g>",
        AXIS + 32.0,
        escape(&days),
        LEFT + WIDTH,
        AXIS + 32.0,
    ));
    for (index, (ts, outcome)) in dated.iter().enumerate() {
        let x = x_of(*ts);
        let event = outcome.event.as_str();
        let (colour, mark, dot) = match event {
            "promoted" => ("#2f7d4f", "✓", AXIS - 14.0),
            "rolled_back" => ("#b3261e", "✗", AXIS + 0.0),
            _ => ("#9a6700", "?", AXIS - 7.0),
        };
        // Labels on three rows in turn, so neighbours rarely overlap.
        let label_y = 12.0 + 11.0 * (index % 3) as f64;
        let version = outcome.version.as_str();
        svg.push_str(&format!(
            "<g class=\"outcome {ev}\"><line x1=\"{x:.1}\" y1=\"{}\" x2=\"{x:.1}\" y2=\"{dot}\" stroke=\"#d8dce3\"/><circle class=\"{ev}\" cx=\"{x:.1}\" cy=\"{dot}\" r=\"5\" fill=\"{colour}\"><title>{ev} {ver} at {when}</title></circle><text class=\"label\" x=\"{x:.1}\" y=\"{label_y}\" text-anchor=\"middle\" fill=\"{colour}\">{ver} {mark}</text></g>",
            label_y + 3.0,
            ev = escape(event),
            ver = escape(version),
            when = escape(&outcome.when),
        ));
    }
    svg.push_str("</svg>");
    svg
}

fn day(ts: f64) -> String {
    chrono::DateTime::from_timestamp(ts.floor() as i64, 0)
        .map_or(String::new(), |t| t.format("%Y-%m-%d").to_string())
}

fn clock(ts: f64) -> String {
    chrono::DateTime::from_timestamp(ts.floor() as i64, 0)
        .map_or(String::new(), |t| t.format("%H:%M:%S").to_string())
}

/// Follows the event stream: each record reloads the sections; countdowns tick in between;
/// buttons post with fetch and show the answer in the CLI's words.
const SCRIPT: &str = r#"<script>
(function () {
  function tick() {
    document.querySelectorAll('.countdown').forEach(function (el) {
      var left = Math.max(0, Number(el.dataset.leftMs) - 1000);
      el.dataset.leftMs = left;
      el.textContent = Math.round(left / 1000) + ' s';
    });
  }
  setInterval(tick, 1000);
  // One fetch at a time; a refresh asked for meanwhile runs once that one is in, since the
  // fetch in flight may have read the page from before the change that asked.
  var pending = false, again = false;
  function refresh() {
    if (pending) { again = true; return; }
    pending = true;
    fetch('/', {headers: {'Accept': 'text/html'}}).then(function (r) { return r.text(); }).then(function (text) {
      var doc = new DOMParser().parseFromString(text, 'text/html');
      var fresh = doc.getElementById('main');
      var said = document.getElementById('said');
      if (fresh) document.getElementById('main').replaceWith(fresh);
      if (said && !document.getElementById('said')) fresh.prepend(said);
      bind();
    }).finally(function () {
      pending = false;
      if (again) { again = false; refresh(); }
    });
  }
  function bind() {
    document.querySelectorAll('form[method=post]').forEach(function (form) {
      form.onsubmit = function (event) {
        event.preventDefault();
        var body = {};
        new FormData(form).forEach(function (v, k) { body[k] = k === 'rollback' ? v === 'true' : v; });
        fetch(form.action, {method: 'POST', headers: {'Content-Type': 'application/json'}, body: JSON.stringify(body)})
          .then(function (r) { return r.json(); }).then(function (answer) {
            var p = document.getElementById('said') || document.createElement('p');
            p.id = 'said'; p.className = 'said';
            p.textContent = answer.said || answer.error || JSON.stringify(answer);
            document.getElementById('main').prepend(p);
            refresh();
          });
      };
    });
  }
  bind();
  if (window.EventSource) {
    var stream = new EventSource('/api/v1/events');
    stream.addEventListener('record', refresh);
  }
})();
</script>"#;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::page_model::OutcomeView;
    use serde::Deserialize;
    use serde_json::json;

    #[test]
    fn text_is_escaped_and_buttons_follow_the_state() {
        let state = json!({"service": "edge<svc>", "root": "/srv/x", "live": null,
            "rollout": {"state": "running", "from": "v1", "version": "v2", "waves": [[0], [1, 2]],
                "slots": [{"slot": 0, "class": "best_effort", "state": "succeeded"},
                          {"slot": 1, "class": "required", "state": "failed", "error": "exit <1>"}],
                "required_waiting": [2], "release_deadline_left_ms": 5000}});
        let page = page(&[Section::read(&state, &[])], false, true, 0.0, None);
        assert!(page.contains("edge&lt;svc&gt;") && !page.contains("edge<svc>"));
        assert!(page.contains("exit &lt;1&gt;"));
        assert!(page.contains(">Pause</button>") && !page.contains(">Resume</button>"));
        assert!(page.contains("required replicas still to confirm: 2"));
        // Slot 1 failed: wave 1 has no replica on v2 and one failure, in red, not progress.
        assert!(page.contains("1 of 1 on v2"), "{page}");
        assert!(
            page.contains("0 of 2 on v2 · <span class=\"bad\">1 failed</span>"),
            "{page}"
        );
        assert!(
            page.contains("class=\"failed\" style=\"width:50%\""),
            "{page}"
        );
        assert!(
            page.contains("class=\"moved\" style=\"width:0%\""),
            "{page}"
        );
        assert!(page.contains("wave 0 of 2 (canary)") && page.contains("wave 1 of 2"));
        assert!(
            page.contains("v2 failed: exit &lt;1&gt;"),
            "the version that failed: {page}"
        );
        let read_only = super::page(&[Section::read(&state, &[])], true, false, 0.0, None);
        assert!(!read_only.contains("<button"));
    }

    #[test]
    fn a_deploy_nobody_drives_says_who_finishes_it_and_an_escalated_one_has_buttons() {
        let candidate = |stage: &str, orphaned: bool| {
            json!({"version": "v7", "port": 9301, "pid": 42, "stage": stage, "started_at": 1.0,
                "waiting_s": 3.0, "deployer_pid": 41, "running": true, "orphaned": orphaned})
        };
        let candidate = |stage: &str, orphaned: bool| {
            CandidateView::deserialize(candidate(stage, orphaned)).unwrap()
        };
        let left = escalated("svc", &candidate("running", true), true);
        assert!(
            left.contains("Its deployer (pid 41) is gone: the next deploy, rollback or <code>rollgate up</code> finishes it."),
            "{left}"
        );
        assert!(!left.contains("<button"), "{left}");
        let gated = escalated("svc", &candidate("running", false), true);
        assert!(!gated.contains("is gone"), "{gated}");
        let held = escalated("svc", &candidate("escalated", false), true);
        assert!(held.contains("data-action=\"promote\"") && !held.contains("is gone"));
    }

    #[test]
    fn the_timeline_places_outcomes_in_time() {
        let outcomes = [
            json!({"ts": 100.0, "event": "promoted", "version": "v1", "when": "a", "reason": null}),
            json!({"ts": 200.0, "event": "rolled_back", "version": "v2", "when": "b"}),
        ];
        let outcomes: Vec<OutcomeView> = outcomes
            .iter()
            .map(|o| OutcomeView::deserialize(o).unwrap())
            .collect();
        let svg = timeline(&outcomes);
        assert!(
            svg.contains("cx=\"40.0\"") && svg.contains("cx=\"720.0\""),
            "{svg}"
        );
        assert!(svg.contains("class=\"rolled_back\""));
        // A time axis with clock labels (1970-01-01 00:01:40 to 00:03:20), and a label each.
        assert!(
            svg.contains(">00:01:40</text>") && svg.contains(">00:03:20</text>"),
            "{svg}"
        );
        assert!(svg.contains(">00:02:30</text>"), "{svg}");
        assert!(svg.contains("1970-01-01 (UTC)"), "{svg}");
        assert!(
            svg.contains(">v1 ✓</text>") && svg.contains(">v2 ✗</text>"),
            "{svg}"
        );
    }

    #[test]
    fn the_release_s_other_processes_are_a_table_a_stopped_one_in_red() {
        let state = json!({"service": "web", "root": "/srv/web",
            "live": {"version": "v3", "port": 9001, "pid": 40, "answering": true},
            "processes": [
                {"process": "worker.0", "process_type": "worker", "version": "v3", "pid": 51,
                 "running": true, "up_for_s": 65.0, "restarts": {"count": 2},
                 "command": "python worker.py <jobs>"},
                {"process": "clock.0", "process_type": "clock", "version": "v3", "pid": 52,
                 "running": false, "restarts": {"count": 0}}]});
        let page = page_of(&state);
        assert!(page.contains("<table class=\"processes\">"), "{page}");
        assert!(
            page.contains("<td>worker.0</td><td>v3</td><td>51</td>"),
            "{page}"
        );
        assert!(
            page.contains("<code>python worker.py &lt;jobs&gt;</code>"),
            "{page}"
        );
        assert!(page.contains("<td class=\"bad\">NO</td>"), "{page}");
        let none = json!({"service": "web", "root": "/srv/web", "live": null});
        assert!(!page_of(&none).contains("class=\"processes\""));
    }

    #[test]
    fn a_stopped_service_says_who_stopped_it_and_how_to_start_it() {
        let state = json!({"service": "web", "root": "/srv/web",
            "live": {"version": "v3", "port": 9001, "pid": 40, "answering": false},
            "stopped": {"service": "web", "since": 1.0, "by": "alice", "why": "disk <swap>"}});
        let page = page(&[Section::read(&state, &[])], false, true, 0.0, None);
        assert!(
            page.contains("STOPPED by alice at ") && page.contains("(disk &lt;swap&gt;)"),
            "{page}"
        );
        assert!(page.contains("<code>rollgate start web</code>"), "{page}");
        let running = json!({"service": "web", "root": "/srv/web", "live": null});
        let page = page_of(&running);
        assert!(!page.contains("STOPPED"));
    }

    fn page_of(state: &serde_json::Value) -> String {
        page(&[Section::read(state, &[])], false, true, 0.0, None)
    }

    #[test]
    fn an_abort_asked_by_a_person_names_no_slot() {
        let state = json!({"service": "svc", "root": "/srv/x", "live": null,
            "rollout": {"state": "aborted", "from": "v1", "version": "v2", "waves": [[0]],
                "abort_cause": {"slot": null, "reason": "bad numbers", "phase": "canary"},
                "slots": [{"slot": 0, "class": "best_effort", "state": "succeeded"}]}});
        let page = page(&[Section::read(&state, &[])], false, true, 0.0, None);
        assert!(page.contains("aborted: bad numbers (canary)"), "{page}");
        assert!(!page.contains("slot -"), "{page}");
    }

    #[test]
    fn the_traffic_judges_last_look_is_a_table_of_both_sides_and_its_verdict() {
        let state = json!({"service": "svc", "root": "/srv/x", "live": null,
            "rollout": {"state": "paused", "from": "v1", "version": "v2", "waves": [[0]],
                "pause_reason": "analysis failed: canary 5xx 3.1 % (41/1320)",
                "analysis": {"verdict": "fail", "canary": "v2", "baseline": "v1<b>",
                    "canary_requests": 1320, "canary_errors": 41, "canary_error_pct": 3.106,
                    "baseline_requests": 1511, "baseline_errors": 3, "baseline_error_pct": 0.198,
                    "canary_latency_ms": 0.61, "baseline_latency_ms": null,
                    "words": "canary 5xx 3.1 % (41/1320) vs baseline 0.2 % (3/1511)"},
                "slots": [{"slot": 0, "class": "best_effort", "state": "succeeded"}]}});
        let page = page(&[Section::read(&state, &[])], false, true, 0.0, None);
        assert!(
            page.contains("<span class=\"verdict fail\">fail</span>"),
            "{page}"
        );
        assert!(
            page.contains(
                "<tr><td>v2</td><td>1320</td><td>41</td><td>3.11 %</td><td>0.61 ms</td></tr>"
            ),
            "{page}"
        );
        assert!(
            page.contains(
                "<tr><td>v1&lt;b&gt;</td><td>1511</td><td>3</td><td>0.20 %</td><td>- ms</td></tr>"
            ),
            "{page}"
        );
    }

    #[test]
    fn a_state_that_does_not_read_is_said_on_the_page_not_shown_as_dashes() {
        // A port that is text: the API changed under the page, and the page says so.
        let state = json!({"service": "svc", "root": "/srv/x",
            "live": {"version": "v1", "port": "eighty", "answering": true}});
        let section = Section::read(&state, &[json!({"event": 7})]);
        let html = page(&[section], false, true, 0.0, None);
        assert!(html.contains("<h2>svc</h2>"), "{html}");
        assert!(
            html.contains("the root&#39;s state could not be read: invalid type: string"),
            "{html}"
        );
    }

    #[test]
    fn the_proxys_certificates_show_with_their_expiry_and_the_last_reload() {
        let state = json!({"service": "svc", "root": "/srv/x", "live": null,
            "tls": {"certificates": [{"name": "a.test", "subject": "CN=a.test",
                "issuer": "CN=<ca>", "not_before": 0, "not_after": 86400, "source": "file",
                "file": "/etc/a.pem"}],
                "last_reload": {"at": 3600, "refused": "/etc/a.key: not a PEM private key"},
                "handshakes": 3, "handshake_failures": {}}});
        let html = page(&[Section::read(&state, &[])], false, true, 0.0, None);
        assert!(
            html.contains("<tr><td>a.test</td><td>CN=&lt;ca&gt;</td><td>1970-01-02 00:00:00 UTC</td><td>file</td></tr>"),
            "{html}"
        );
        assert!(
            html.contains("read again at 1970-01-01 01:00:00 UTC: not taken, the ones before go on: /etc/a.key: not a PEM private key"),
            "{html}"
        );
    }
}
