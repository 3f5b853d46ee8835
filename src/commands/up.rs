//! `rollgate up`: starts every live release the root's state names that is not running (after
//! a reboot), on the same port, in the same folder and environment the deployer gives it,
//! through a keeper of its own (`host::keeper`), records the new process where the old one was
//! named, and gives a keeper to a running live release that has none. `--supervise` keeps
//! doing the latter and sends the roots' webhooks; restarting a release that exits is its
//! keeper's work, the same for a release `up` started as for one a deploy started
//! (`supervision::supervise`).
//!
//! The state is only changed under the root's lock.

use std::path::PathBuf;
use std::time::Duration;

use crate::engine;
use crate::error::Error;
use crate::host::keeper::Backoff;
use crate::host::lock;
use crate::host::signals::Signals;
use crate::host::state::Root;

use crate::supervision::supervise::{self, Dead, Found};

/// How often `--supervise` looks for a live release without a keeper.
const SUPERVISE_POLL: Duration = Duration::from_millis(500);

#[derive(Debug, Clone)]
pub struct Options {
    /// Every root to bring up (a host's services: one root each).
    pub roots: Vec<PathBuf>,
    pub supervise: bool,
    /// How long a started release may take to pass its probe.
    pub ready: Duration,
    pub max_restarts: u32,
    pub backoff: Duration,
}

/// `rollgate up`: once, or for ever with `--supervise`. The text says what each release is.
pub fn up(options: Options) -> Result<String, Error> {
    let roots = options
        .roots
        .iter()
        .map(|root| Root::existing(root.clone()))
        .collect::<Result<Vec<Root>, _>>()?;
    crate::engine::runtime()?.block_on(async {
        let mut signals = Signals::install()?;
        // Every root at once, each under its own lock (issue 80, 6: after a reboot a fast
        // service waited for a slow one); said in the order given. One root that cannot be
        // brought up does not keep the others down.
        let passes = roots.iter().map(|root| once(root, &options));
        let reports = futures_util::future::join_all(passes).await;
        let (mut said, mut all_ok) = (String::new(), true);
        for (root, report) in roots.iter().zip(reports) {
            let report = report?;
            all_ok &= report.iter().all(Found::ok);
            said.push_str(&lines(root, &report, roots.len() > 1));
        }
        if !options.supervise {
            return if all_ok {
                Ok(said)
            } else {
                Err(Error::Failed(said))
            };
        }
        eprint!("{said}");
        // The roots' webhooks are sent while they are supervised (one sender at a time).
        let sending = roots.clone();
        std::thread::spawn(move || crate::webhooks::keep_sending(sending, || true));
        // One supervisor per root, all stopped by the first signal.
        let (stop, stopped) = tokio::sync::watch::channel(None);
        let mut supervisors = tokio::task::JoinSet::new();
        for root in roots {
            let (options, stopped) = (options.clone(), stopped.clone());
            supervisors.spawn(async move { supervise(&root, &options, stopped).await });
        }
        let name = tokio::select! {
            name = signals.recv() => name,
            ended = supervisors.join_next() => match ended {
                Some(Ok(Err(e))) => return Err(e),
                _ => "the end of a supervisor",
            },
        };
        let _ = stop.send(Some(name));
        while supervisors.join_next().await.is_some() {}
        Ok(format!(
            "rollgate up: stopped by {name}; the releases keep running\n"
        ))
    })
}

/// A root's lines; with several roots, under the root's name.
fn lines(root: &Root, report: &[Found], several: bool) -> String {
    let mut out = match several {
        true => format!("{}:\n", root.0.display()),
        false => String::new(),
    };
    if report.is_empty() {
        out.push_str("nothing is live under this root\n");
    }
    for found in report {
        out.push_str(&format!("{}\n", found.text()));
    }
    out
}

/// One pass under the lock: finish what a dead deployer left, then start what is not running
/// and keep what runs. A line per release.
async fn once(root: &Root, options: &Options) -> Result<Vec<Found>, Error> {
    let _lock = lock::acquire(&root.lock_path())?;
    engine::recover_leaving_escalated(root).await?;
    // A service a person stopped is left stopped (a boot included).
    if let Some(stopped) = crate::host::stopped::read(&root.0)? {
        return Ok(vec![Found::Unchanged(format!(
            "{}: {}; `rollgate start {}` starts it",
            stopped.service,
            stopped.words(),
            stopped.service
        ))]);
    }
    supervise::ensure(
        root,
        options.ready,
        options.backoff(),
        Dead::Restart("rollgate up"),
    )
    .await
}

impl Options {
    fn backoff(&self) -> Backoff {
        Backoff {
            first_ms: self.backoff.as_millis() as u64,
            max_restarts: self.max_restarts,
        }
    }
}

/// `--supervise`, for one root: every live release keeps a keeper (one killed, or gone with a
/// host's old rollgate, is replaced). A release its keeper gave up on is left stopped.
async fn supervise(
    root: &Root,
    options: &Options,
    mut stopped: tokio::sync::watch::Receiver<Option<&'static str>>,
) -> Result<String, Error> {
    loop {
        tokio::select! {
            _ = stopped.changed() => return Ok(String::new()),
            _ = tokio::time::sleep(SUPERVISE_POLL) => {}
        }
        if !root.0.is_dir() {
            return Err(Error::Failed(format!(
                "root {} is gone; nothing left to supervise",
                root.0.display()
            )));
        }
        // Stopped by a person: nothing of it is brought back until `rollgate start`.
        if crate::host::stopped::read(&root.0).ok().flatten().is_some() {
            continue;
        }
        // Looked at without the lock: it is taken only when there is something to do.
        if !needs_a_pass(root) {
            continue;
        }
        // A deploy holds the lock: it owns the state now; look again next round.
        let Ok(_lock) = lock::acquire(&root.lock_path()) else {
            continue;
        };
        // What a deployer that died left is finished first (a watch it cut short decides
        // whether its release stays): never restart a release it had not promoted yet.
        if let Err(e) = engine::recover_leaving_escalated(root).await {
            eprintln!("rollgate up: {e}");
            continue;
        }
        let why = Dead::Unkept("rollgate up --supervise");
        match supervise::ensure(root, options.ready, options.backoff(), why).await {
            Ok(report) => {
                for failed in report.iter().filter(|f| !f.ok()) {
                    eprintln!("rollgate up: {}", failed.text());
                }
            }
            Err(e) => eprintln!("rollgate up: {e}"),
        }
    }
}

/// Whether a live release runs without a keeper, or is not running with none holding it (its
/// keeper let it go while a run held the root, or was killed).
fn needs_a_pass(root: &Root) -> bool {
    let kept = crate::host::keeper::kept(&root.0, false).releases();
    supervise::live_set(root).is_ok_and(|set| set.iter().any(|live| !kept.contains(&live.identity)))
}
