//! Tables read on a real terminal (issue 36): `log history`, `status` and `rollout status` run
//! in a pseudo-terminal of 80, 100 and 200 columns (util-linux `script`, the width set with
//! `stty`). Each line fits, no word is broken inside, the default view has the few columns a
//! person reads first and none that is empty in every row, `--wide` shows the rest; piped, the
//! same commands keep every column for scripts.

use crate::common::*;

/// What `rollgate ARGS` prints on a terminal `width` columns wide.
fn on_terminal(width: u16, args: &[&str]) -> String {
    let rollgate = crate::common::bin();
    let quoted: Vec<String> = std::iter::once(rollgate.display().to_string())
        .chain(args.iter().map(|a| a.to_string()))
        .map(|a| format!("'{}'", a.replace('\'', r"'\''")))
        .collect();
    let command = format!("stty cols {width} rows 50; NO_COLOR=1 {}", quoted.join(" "));
    let out = std::process::Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .output()
        .expect("script(1) from util-linux");
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out).replace('\r', "")
}

fn piped(args: &[&str]) -> String {
    let out = rollgate().args(args).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out)
}

/// The words of a table: what lies between spaces and box-drawing characters.
fn words(text: &str) -> Vec<String> {
    text.split(|c: char| c.is_whitespace() || ('\u{2500}'..='\u{257f}').contains(&c))
        .filter(|w| !w.is_empty())
        .map(String::from)
        .collect()
}

/// A word the terminal view writes its own way: a clock time, or the day said in a header.
fn shortened(word: &str) -> bool {
    let clock = word.len() >= 8
        && word.chars().enumerate().all(|(i, c)| match i {
            2 | 5 => c == ':',
            8 => c == '.',
            _ => c.is_ascii_digit(),
        });
    clock || word == "UTC)" || (word.starts_with("(20") && word.len() == 11)
}

/// Every line within the width, and every word one the piped output has whole.
fn fits_without_broken_words(width: u16, terminal: &str, pipe: &str) {
    for line in terminal.lines() {
        assert!(
            line.chars().count() <= width as usize,
            "wider than {width}: {line}\n{terminal}"
        );
    }
    no_broken_words(width, terminal, pipe);
}

/// Every word of the terminal's table is one the piped output has whole (column names read
/// as words there: `time_to_outcome_s` is "time to outcome").
fn no_broken_words(width: u16, terminal: &str, pipe: &str) {
    let whole = words(&pipe.replace('_', " "));
    for word in words(&terminal.replace('_', " ")) {
        assert!(
            whole.contains(&word) || shortened(&word),
            "`{word}` is broken at width {width}:\n{terminal}"
        );
    }
}

/// The README's first deploy: v1 promoted, v2 rolled back (not ready by 1500 ms).
fn first_deploys() -> Site {
    let site = Site::new();
    site.release("v1", "");
    site.release("v2", "--ready-after-ms 60000");
    assert_eq!(site.deploy(free_port(), "v1", &[]).status.code(), Some(0));
    assert_eq!(site.deploy(free_port(), "v2", &[]).status.code(), Some(1));
    site
}

#[test]
fn log_history_fits_80_100_and_200_columns_and_a_pipe_keeps_every_column() {
    let site = first_deploys();
    let log = site.root().join("deploy.log");
    let log = log.to_str().unwrap();
    let pipe = piped(&["log", "history", log]);
    for column in ["live_for_s", "rolled_back_at", "exposure_s", "started"] {
        assert!(pipe.contains(column), "piped keeps {column}: {pipe}");
    }
    for width in [80, 100, 200] {
        let text = on_terminal(width, &["log", "history", log]);
        fits_without_broken_words(width, &text, &pipe);
        for column in [
            "version",
            "finished",
            "outcome",
            "reason",
            "promoted",
            "rolled_back",
        ] {
            assert!(text.contains(column), "{width}: {column} shown:\n{text}");
        }
        assert!(text.contains("time to"), "{text}");
        for column in [
            "live for",
            "rolled back at",
            "exposure",
            "started",
            "live now",
        ] {
            assert!(
                !text.contains(column),
                "{width}: {column} left out:\n{text}"
            );
        }
        // The two attempts share a day: it is said once, in the header.
        assert!(!text.contains("T2"), "{width}: full timestamps:\n{text}");
        assert!(text.contains(" UTC)"), "{text}");

        // Wider than 80 columns it may be; its words are whole all the same.
        let wide = on_terminal(width, &["log", "history", "--wide", log]);
        no_broken_words(width, &wide, &pipe);
        if width >= 100 {
            fits_without_broken_words(width, &wide, &pipe);
        }
        assert!(
            wide.contains("started"),
            "{width}: --wide shows started:\n{wide}"
        );
        assert!(wide.contains("live") && wide.contains("true"), "{wide}");
        // Empty in every row, even with --wide.
        assert!(!wide.contains("rolled back at"), "{wide}");
    }
}

#[test]
fn status_and_rollout_status_fit_the_terminal_too() {
    let site = first_deploys();
    let root = site.root().to_str().unwrap();
    // The last outcomes (the figures above them count the seconds since the switch).
    let outcomes = |text: &str| text.split_once("Last outcomes").unwrap().1.to_string();
    let pipe = outcomes(&piped(&["status", "--root", root]));
    for width in [80, 100, 200] {
        let text = outcomes(&on_terminal(width, &["status", "--root", root]));
        fits_without_broken_words(width, &text, &pipe);
        assert!(text.contains("rolled_back"), "{text}");
    }

    let replicas = Site::new();
    replicas.release("v1", "");
    replicas.replicas_of("v1", 3, 50);
    let root = replicas.root().to_str().unwrap();
    let args = ["rollout", "status", "edge-svc", "--root", root];
    let pipe = piped(&args);
    assert!(pipe.contains("class") && pipe.contains("started"), "{pipe}");
    for width in [80, 100, 200] {
        let text = on_terminal(width, &args);
        fits_without_broken_words(width, &text, &pipe);
        assert!(
            text.contains("succeeded") && text.contains("serving"),
            "{text}"
        );
        // The error column is empty for every replica; class and started wait for --wide.
        for column in ["error", "class", "started"] {
            assert!(!text.contains(column), "{width}: {column}:\n{text}");
        }
        let mut wide_args = args.to_vec();
        wide_args.push("--wide");
        let wide = on_terminal(width, &wide_args);
        assert!(
            wide.contains("class") && wide.contains("best_effort"),
            "{wide}"
        );
    }
}
