//! The signals that end a gate early (and must never kill rollgate between a rename and the log
//! line that records it): SIGINT, SIGTERM and SIGHUP. Once installed, they no longer terminate
//! the process for its whole life, so a signal after the gate lets the switch or rollback finish.

use tokio::signal::unix::{signal, Signal, SignalKind};

use super::fault::Fault;

pub(crate) struct Signals {
    interrupt: Signal,
    terminate: Signal,
    hangup: Signal,
}

impl Signals {
    /// Installs the handlers; done before anything is recorded or spawned, so a failure here
    /// leaves nothing behind.
    pub(crate) fn install() -> Result<Signals, Fault> {
        let install = |kind: SignalKind, name: &'static str| {
            signal(kind).map_err(|source| Fault::Signals {
                signal: name,
                source,
            })
        };
        Ok(Signals {
            interrupt: install(SignalKind::interrupt(), "SIGINT")?,
            terminate: install(SignalKind::terminate(), "SIGTERM")?,
            hangup: install(SignalKind::hangup(), "SIGHUP")?,
        })
    }

    /// The name of the next signal received.
    pub(crate) async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.terminate.recv() => "SIGTERM",
            _ = self.interrupt.recv() => "SIGINT",
            _ = self.hangup.recv() => "SIGHUP",
        }
    }
}
