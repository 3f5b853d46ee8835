//! `log ...`: the deploy log's summary, history, follow, stats and SQL.

use std::io::Write;

use rollgate::error::{self, Error};
use rollgate::log;
use rollgate::render::table::Layout;

use super::eval_options;
use crate::cli::{LogCommand, ReadArgs};

pub fn run_log(command: LogCommand) -> Result<u8, Error> {
    let result = match command {
        LogCommand::Summary {
            logs,
            merge,
            query,
            access,
            eval,
            format,
            read,
        } => {
            let eval = eval_options(eval);
            reading(read)
                .and_then(|r| {
                    log::summary(
                        &logs,
                        merge,
                        format,
                        &r,
                        query.as_deref().map(|q| (q, &eval)),
                    )
                })
                .and_then(|text| match access.is_empty() {
                    true => Ok(text),
                    false => log::access_summary(&access, format).map(|more| text + &more),
                })
                .map(log::Answer::Text)
        }
        LogCommand::History {
            logs,
            at,
            format,
            wide,
            read,
        } => reading(read).and_then(|r| match at {
            Some(at) => rollgate::render::time::parse_time(&at)
                .map_err(|e| log::LogError::Usage(e.to_string()))
                .and_then(|at| log::live_at(&logs, at, format, &r))
                .map(log::Answer::Text),
            None => log::history(&logs, format, Layout::of_stdout(wide), &r),
        }),
        LogCommand::Follow {
            log,
            from_start,
            format,
            read,
        } => {
            let start = if from_start {
                log::follow::Start::Beginning
            } else {
                log::follow::Start::End
            };
            let reading = reading(read)?;
            let mut out = std::io::stdout().lock();
            log::follow::print_records(&log, start, format, &reading, &mut out, || true)?;
            return Ok(error::SUCCESS);
        }
        LogCommand::Schedules { logs, format, read } => reading(read)
            .and_then(|r| log::schedules(&logs, format, &r))
            .map(log::Answer::Text),
        LogCommand::Stats { logs, format, read } => reading(read)
            .and_then(|r| log::stats(&logs, format, &r))
            .map(log::Answer::Text),
        LogCommand::Query {
            logs,
            access,
            sql,
            format,
            read,
        } => reading(read).and_then(|r| log::query(&logs, &sql, format, &r, &access)),
    };
    // Rows are written as they are rendered; a reader that went away (`| head`) ends it.
    let answer = result?;
    let mut out = std::io::stdout().lock();
    let _ = answer.write_to(&mut out).and_then(|()| out.flush());
    Ok(error::SUCCESS)
}

pub fn reading(args: ReadArgs) -> Result<log::Reading, log::LogError> {
    let time = |t: Option<String>| {
        t.map(|t| {
            rollgate::render::time::parse_time(&t).map_err(|e| log::LogError::Usage(e.to_string()))
        })
        .transpose()
    };
    Ok(log::Reading {
        strict: args.strict,
        selection: log::Selection {
            since: time(args.since)?,
            until: time(args.until)?,
            version: args.only_version,
        },
        everything: false,
        release_fields: false,
        rollout_fields: false,
        columns: None,
        reported: false,
    })
}
