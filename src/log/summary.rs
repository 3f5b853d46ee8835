//! The lesson's summary: outcomes counted, each rollback's reason, and the live release taken
//! from the last promotion only. Computed straight from the columns: one pass, no frame.

use serde::{Deserialize, Serialize};

use super::read::{Log, ReadOptions, Record, Sink};
use crate::host::journal::LogEvent;

/// Outcome events. Everything else (`candidate_started`, `escalated`, unknown events) is not an
/// outcome and is not counted.
pub const PROMOTED: &str = LogEvent::Promoted.as_str();
pub const ROLLED_BACK: &str = LogEvent::RolledBack.as_str();
pub const STARTED: &str = LogEvent::CandidateStarted.as_str();
/// A rollout of several replicas opens an attempt as a single deploy's start does.
pub const ROLLOUT_STARTED: &str = LogEvent::RolloutStarted.as_str();

/// Field order is the output's key order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Summary {
    pub releases: u64,
    pub promoted: u64,
    pub rolled_back: u64,
    pub reasons: Vec<Reason>,
    pub live: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reason {
    pub version: Option<String>,
    pub reason: Option<String>,
}

/// The reason is the detail up to its first `"; "` — not one inside a quoted command
/// (between backticks: `the release phase (`migrate; seed`) failed …`); what follows is
/// context for a person. A detail whose backticks do not pair is cut at its first `"; "`.
pub fn reason_of(detail: &str) -> &str {
    let plain = || detail.split("; ").next().unwrap_or(detail);
    if !detail.contains('`') {
        return plain();
    }
    let bytes = detail.as_bytes();
    let mut quoted = false;
    for (i, byte) in bytes.iter().enumerate() {
        match byte {
            b'`' => quoted = !quoted,
            b';' if !quoted && bytes.get(i + 1) == Some(&b' ') => return &detail[..i],
            _ => {}
        }
    }
    match quoted {
        true => plain(),
        false => detail,
    }
}

pub fn summarize(log: &Log) -> Summary {
    let mut summary = Summary {
        releases: 0,
        promoted: 0,
        rolled_back: 0,
        reasons: Vec::new(),
        live: None,
    };
    for i in 0..log.len() {
        match log.event[i].as_deref() {
            Some(PROMOTED) => {
                summary.promoted += 1;
                summary.live = log.version[i].clone();
            }
            Some(ROLLED_BACK) => {
                summary.rolled_back += 1;
                summary.reasons.push(Reason {
                    version: log.version[i].clone(),
                    reason: log.detail[i].as_deref().map(|d| reason_of(d).to_string()),
                });
            }
            _ => continue,
        }
        summary.releases += 1;
    }
    summary
}

/// The summary computed while the log is read: only the outcomes are looked at and only the
/// reasons kept, so memory stays flat however long the log. Answers exactly as [`summarize`].
#[derive(Debug)]
pub struct Streaming(pub Summary);

impl Sink for Streaming {
    fn new(_: ReadOptions) -> Self {
        Streaming(summarize(&Log::default()))
    }

    fn record(&mut self, _line: u64, record: Record<'_>) {
        let s = &mut self.0;
        match record.event.as_deref() {
            Some(PROMOTED) => {
                s.promoted += 1;
                s.live = record.version.map(|v| v.into_owned());
            }
            Some(ROLLED_BACK) => {
                s.rolled_back += 1;
                s.reasons.push(Reason {
                    version: record.version.map(|v| v.into_owned()),
                    reason: record.detail.as_deref().map(|d| reason_of(d).to_string()),
                });
            }
            _ => return,
        }
        s.releases += 1;
    }

    fn absorb(&mut self, later: Self, _line_offset: u64) {
        let (s, later) = (&mut self.0, later.0);
        s.releases += later.releases;
        s.promoted += later.promoted;
        s.rolled_back += later.rolled_back;
        s.reasons.extend(later.reasons);
        if later.promoted > 0 {
            s.live = later.live;
        }
    }
}

impl Summary {
    /// The compact one-line JSON the lesson prints.
    pub fn to_json_line(&self) -> String {
        serde_json::to_string(self).expect("a summary always serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::read::{parse_bytes, ReadOptions};

    #[test]
    fn a_reason_is_cut_at_its_first_separator_outside_a_quoted_command() {
        assert_eq!(
            reason_of("not ready after 4000 ms; old release v1"),
            "not ready after 4000 ms"
        );
        assert_eq!(
            reason_of("the release phase (`migrate; seed`) failed with exit status: 3; the deploy was refused"),
            "the release phase (`migrate; seed`) failed with exit status: 3"
        );
        // Backticks that do not pair: as before.
        assert_eq!(reason_of("a ` b; c"), "a ` b");
        assert_eq!(reason_of("no separator"), "no separator");
    }

    fn summary_of(text: &str) -> String {
        summarize(&parse_bytes::<Log>(text.as_bytes(), ReadOptions::default()).0).to_json_line()
    }

    #[test]
    fn a_rolled_back_release_is_never_live() {
        let log = r#"{"ts":1,"event":"candidate_started","version":"v2","detail":""}
{"ts":2,"event":"promoted","version":"v2","detail":"ready after 300 ms"}
{"ts":3,"event":"candidate_started","version":"v3","detail":""}
{"ts":5,"event":"rolled_back","version":"v3","detail":"not ready after 1500 ms; old release v2 answering"}
"#;
        assert_eq!(
            summary_of(log),
            r#"{"releases":2,"promoted":1,"rolled_back":1,"reasons":[{"version":"v3","reason":"not ready after 1500 ms"}],"live":"v2"}"#
        );
    }

    #[test]
    fn empty_and_noise_only_logs() {
        let none = r#"{"releases":0,"promoted":0,"rolled_back":0,"reasons":[],"live":null}"#;
        assert_eq!(summary_of(""), none);
        assert_eq!(summary_of("hello\n\n  {\"event\":\"promoted\"}\n"), none);
    }

    proptest::proptest! {
        /// The streaming summary and the one over columns agree on any mix of records, noise
        /// and broken lines, whatever the block boundaries.
        #[test]
        fn streaming_equals_columns(lines in proptest::collection::vec(
            proptest::prop_oneof![
                proptest::strategy::Just("{\"event\":\"promoted\",\"version\":\"v1\"}".to_string()),
                proptest::strategy::Just("{\"event\":\"promoted\"}".to_string()),
                proptest::strategy::Just("{\"event\":\"rolled_back\",\"version\":\"v2\",\"detail\":\"a; b\"}".to_string()),
                proptest::strategy::Just("{\"event\":\"rolled_back\",\"version\":7}".to_string()),
                proptest::strategy::Just("{\"event\":\"candidate_started\",\"version\":\"v3\"}".to_string()),
                proptest::strategy::Just("{\"event\":\"promo".to_string()),
                proptest::strategy::Just("noise".to_string()),
                "[a-z{}\":, ]{0,30}",
            ],
            0..60,
        )) {
            let text = lines.join("\n");
            let columns = summarize(&parse_bytes::<Log>(text.as_bytes(), ReadOptions::default()).0);
            let streaming = parse_bytes::<Streaming>(text.as_bytes(), ReadOptions::default()).0 .0;
            proptest::prop_assert_eq!(columns, streaming);
        }
    }

    #[test]
    fn reason_is_the_detail_up_to_the_first_separator() {
        assert_eq!(reason_of("a; b; c"), "a");
        assert_eq!(reason_of("a;b"), "a;b");
        assert_eq!(reason_of(""), "");
    }
}
