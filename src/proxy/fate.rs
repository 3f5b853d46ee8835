//! How a request ended (issue 79): every request whose head the proxy read has exactly one
//! fate, written in its access log line (`fate`) and added to exactly one count, so the log's
//! lines of a route and release equal what `/metrics` says of them:
//! - a release answered: its answer is counted by status class on the release at its head
//!   (`answers`), and the line says `answered`, or why the body did not reach the client whole
//!   (a [`Cut`], also counted on the release: the judge takes the release's cuts as failures);
//! - no release answered: counted on the release tried (`misses`), `upstream_refused`,
//!   `upstream_reset` or `upstream_error`;
//! - rollgate answered itself, or the client left before any answer: counted on the route by
//!   [`Reason`], the line naming no release.

use super::counts::{Cut, Miss, Reason, RouteCounts, REASONS};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// A release's answer, sent whole.
    Answered,
    /// A release's answer that did not reach the client whole.
    Cut(Cut),
    /// No release answered (502): the release tried failed it.
    Unanswered(Miss),
    /// rollgate's own answer, or none: the client left first.
    Own(Reason),
}

impl Fate {
    /// The access log line's `fate`.
    pub fn label(self) -> &'static str {
        match self {
            Fate::Answered => "answered",
            Fate::Cut(Cut::ClientClosed) => "client_closed",
            Fate::Cut(Cut::UpstreamReset) => "upstream_reset",
            Fate::Cut(Cut::UpstreamTimeout) => "upstream_timeout",
            Fate::Unanswered(Miss::Refused) => "upstream_refused",
            Fate::Unanswered(Miss::Reset) => "upstream_reset",
            Fate::Unanswered(Miss::Other) => "upstream_error",
            Fate::Own(reason) => REASONS[reason as usize],
        }
    }

    /// Whether the line names a release: every fate but rollgate's own.
    pub fn names_a_release(self) -> bool {
        !matches!(self, Fate::Own(_))
    }

    /// Adds an own answer to its route's count (a release's fates are counted on the release
    /// where they happen: `pass.rs`, the answer's body).
    pub fn count_on(self, route: &RouteCounts, thread: usize) {
        if let Fate::Own(reason) = self {
            route.ended(thread, reason);
        }
    }
}

/// The reason of rollgate's own answer with `status` (each status it answers with itself has
/// one meaning, but 503, which [`Reason::Maintenance`] shares: the gate says so itself).
pub fn reason_of(status: u16) -> Reason {
    match status {
        308 => Reason::Redirect,
        404 => Reason::NotFound,
        413 => Reason::RefusedBody,
        421 => Reason::Misdirected,
        499 => Reason::ClientClosed,
        502 | 503 => Reason::NoRelease,
        _ => Reason::BadRequest,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fate_has_its_own_label_but_the_two_resets_and_the_two_client_leavings() {
        let fates = [
            Fate::Answered,
            Fate::Cut(Cut::ClientClosed),
            Fate::Cut(Cut::UpstreamReset),
            Fate::Cut(Cut::UpstreamTimeout),
            Fate::Unanswered(Miss::Refused),
            Fate::Unanswered(Miss::Reset),
            Fate::Unanswered(Miss::Other),
            Fate::Own(Reason::Redirect),
            Fate::Own(Reason::RefusedBody),
            Fate::Own(Reason::ClientClosed),
        ];
        let labels: std::collections::BTreeSet<_> = fates.iter().map(|f| f.label()).collect();
        assert_eq!(labels.len(), fates.len() - 2);
        assert_eq!(Fate::Own(reason_of(413)).label(), "refused_body");
        assert!(!Fate::Own(Reason::ClientClosed).names_a_release());
        assert!(Fate::Cut(Cut::ClientClosed).names_a_release());
    }
}
