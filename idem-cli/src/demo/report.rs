//! What `idem demo` counted, and its closing table.

/// The time from an operation's first send to its answer, over some of a run's operations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AnswerTimes {
    /// How many operations were timed.
    pub operations: usize,
    /// Median, in milliseconds (0 without operations).
    pub p50_ms: u64,
    /// 99th percentile (nearest rank), in milliseconds (0 without operations).
    pub p99_ms: u64,
}

impl AnswerTimes {
    /// The times of `ms` (in any order).
    pub(crate) fn of(ms: &[u64]) -> Self {
        let mut ms = ms.to_vec();
        ms.sort_unstable();
        let at = |p: usize| {
            let rank = (ms.len() * p).div_ceil(100).max(1);
            ms.get(rank - 1).copied().unwrap_or(0)
        };
        Self {
            operations: ms.len(),
            p50_ms: at(50),
            p99_ms: at(99),
        }
    }
}

/// What one run produced.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DemoReport {
    /// Operations the agents meant to perform (each once).
    pub operations: usize,
    /// HTTP requests sent.
    pub attempts: usize,
    /// Answers that were first executions.
    pub executed: usize,
    /// Answers that were replays.
    pub replays: usize,
    /// Answers that said "in flight" (409).
    pub conflicts: usize,
    /// Of `conflicts`, those to operations whose attempts time out before the tool answers: an
    /// attempt shorter than the tool has no answer to wait for within its own deadline.
    pub conflicts_timed_out: usize,
    /// Of `conflicts`, those to operations sent twice at once (none when retries wait).
    pub conflicts_sent_twice: usize,
    /// Of `conflicts`, those to retries of a hung holder's operation: no answer exists until the
    /// holder's lease ends.
    pub conflicts_hung: usize,
    /// Operations that got no answer within their deadline.
    pub unanswered: usize,
    /// Tickets at the sink.
    pub tickets: i64,
    /// Operations with more than one ticket.
    pub double_effects: i64,
    /// Time from an operation's first send to its answer (all its concurrent sends answered),
    /// median, in milliseconds.
    pub answer_p50_ms: u64,
    /// The same, 99th percentile.
    pub answer_p99_ms: u64,
    /// The same over the operations repeated while their first attempt ran: the two below.
    pub retried_while_running: AnswerTimes,
    /// Operations whose attempts time out before the tool answers, so each is retried while
    /// the tool still runs (the client's attempt deadline is shorter than the tool).
    pub attempt_timed_out: AnswerTimes,
    /// Operations sent twice at once: the second send arrives while the first runs.
    pub sent_twice: AnswerTimes,
    /// Operations whose first holder hangs (a crash mid-flight): the retry resolves them once
    /// the holder's lease ends.
    pub holder_hung: AnswerTimes,
}

/// The closing table; a second column when the run without idem is given.
pub fn table(with: &DemoReport, without: Option<&DemoReport>) -> String {
    let cells = |r: &DemoReport| {
        [
            r.operations as i64,
            r.attempts as i64,
            r.executed as i64,
            r.replays as i64,
            r.conflicts as i64,
            r.conflicts_timed_out as i64,
            r.conflicts_sent_twice as i64,
            r.conflicts_hung as i64,
            r.unanswered as i64,
            r.tickets,
            r.double_effects,
            r.answer_p50_ms as i64,
            r.answer_p99_ms as i64,
            r.retried_while_running.p50_ms as i64,
            r.retried_while_running.p99_ms as i64,
            r.attempt_timed_out.p50_ms as i64,
            r.attempt_timed_out.p99_ms as i64,
            r.sent_twice.p50_ms as i64,
            r.sent_twice.p99_ms as i64,
            r.holder_hung.p50_ms as i64,
            r.holder_hung.p99_ms as i64,
        ]
    };
    let names = [
        "operations",
        "attempts (HTTP requests)",
        "answered: executed",
        "answered: replayed",
        "409 in flight",
        "- attempt timed out",
        "- sent twice at once",
        "- holder hung",
        "unanswered",
        "tickets at the sink",
        "double effects",
        "answer p50 (ms)",
        "answer p99 (ms)",
        "retried while running p50 (ms)",
        "retried while running p99 (ms)",
        "- attempt timed out p50 (ms)",
        "- attempt timed out p99 (ms)",
        "- sent twice at once p50 (ms)",
        "- sent twice at once p99 (ms)",
        "holder hung p50 (ms)",
        "holder hung p99 (ms)",
    ];
    let mut out = format!("{:<32}{:>12}", "", "with idem");
    if without.is_some() {
        out.push_str(&format!("{:>16}", "without idem"));
    }
    out.push('\n');
    let (with, without) = (cells(with), without.map(cells));
    for (i, name) in names.iter().enumerate() {
        out.push_str(&format!("{name:<32}{:>12}", with[i]));
        if let Some(w) = &without {
            out.push_str(&format!("{:>16}", w[i]));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answer_times_are_nearest_rank_percentiles() {
        let ms: Vec<u64> = (1..=200).rev().collect();
        assert_eq!(
            AnswerTimes::of(&ms),
            AnswerTimes {
                operations: 200,
                p50_ms: 100,
                p99_ms: 198
            }
        );
        assert_eq!(AnswerTimes::of(&[]), AnswerTimes::default());
    }

    #[test]
    fn the_table_has_a_row_per_figure_and_a_column_per_run() {
        let with = DemoReport {
            sent_twice: AnswerTimes {
                operations: 2,
                p50_ms: 310,
                p99_ms: 330,
            },
            ..DemoReport::default()
        };
        let without = DemoReport {
            tickets: 7,
            ..DemoReport::default()
        };
        let text = table(&with, Some(&without));
        let row = |name: &str| -> Vec<String> {
            let line = text.lines().find(|l| l.starts_with(name)).unwrap();
            line[name.len()..]
                .split_whitespace()
                .map(str::to_owned)
                .collect()
        };
        assert_eq!(row("- sent twice at once p99 (ms)"), ["330", "0"]);
        assert_eq!(row("tickets at the sink"), ["0", "7"]);
        assert_eq!(text.lines().count(), 22);
    }
}
