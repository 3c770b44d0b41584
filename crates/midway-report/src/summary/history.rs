//! History told by the project's own numbered work ("in session 12", "(round 7)", "this
//! session"), which no reader can resolve: the docs date history by dates and commits instead.
//!
//! "Round" is also the benchmark's word (`--rounds 3`, "medians of 3 rounds", "the first
//! round"), and "session" a protocol's (TLS session resumption, sticky sessions), so only these
//! forms are history references:
//!
//! - "session" or "round" followed by a number: "session 12", "sessions 14 and 15",
//!   "session-5", "(round 7)" (but not the option `--rounds 3`, nor a placeholder `ROUNDS`);
//! - "session" after a word that points at the project's own work ("this session", "earlier
//!   sessions", "over two sessions") or before "start", "end" or "'s" ("the session's start").

/// Words before "session" that make it the project's own work rather than a protocol's.
const POINTING_WORDS: [&str; 12] = [
    "this", "that", "earlier", "previous", "next", "last", "same", "later", "each", "two", "three",
    "several",
];
/// Words after "session" that do the same.
const FOLLOWING_WORDS: [&str; 3] = ["start", "end", "s"];

/// A word of a line, where it starts, and the characters just before it.
struct Word<'a> {
    text: &'a str,
    start: usize,
    preceded_by: &'a str,
}

fn words(line: &str) -> Vec<Word<'_>> {
    let mut words = Vec::new();
    let mut previous_end = 0;
    let mut start = None;
    for (i, c) in line
        .char_indices()
        .chain(std::iter::once((line.len(), ' ')))
    {
        let in_word = c.is_ascii_alphanumeric();
        match (in_word, start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                words.push(Word {
                    text: &line[s..i],
                    start: s,
                    preceded_by: &line[previous_end..s],
                });
                previous_end = i;
                start = None;
            }
            _ => {}
        }
    }
    words
}

fn is_number(word: &str) -> bool {
    !word.is_empty() && word.bytes().all(|b| b.is_ascii_digit())
}

/// The history references in `line`, each as the words that make it one.
pub(crate) fn history_references(line: &str) -> Vec<String> {
    let words = words(line);
    let mut found = Vec::new();
    for (i, word) in words.iter().enumerate() {
        let lower = word.text.to_ascii_lowercase();
        let is_session = lower == "session" || lower == "sessions";
        let is_round = lower == "round" || lower == "rounds";
        if !is_session && !is_round {
            continue;
        }
        let next = words.get(i + 1);
        // "3 rounds 15 % better" counts rounds; a number with a unit is no history.
        let followed_by_number = next.is_some_and(|n| {
            let after = line[n.start + n.text.len()..].trim_start();
            is_number(n.text)
                && matches!(n.preceded_by, " " | "-" | "\u{a0}")
                && !after.starts_with('%')
        });
        let end = next.map_or(line.len(), |n| n.start + n.text.len());
        let quoted = || line[word.start..end].to_string();
        if is_round {
            // `--rounds 3` is the bench's option, ROUNDS a placeholder in a usage line.
            let option = word.preceded_by.ends_with("--");
            let placeholder = word.text.bytes().all(|b| b.is_ascii_uppercase());
            if followed_by_number && !option && !placeholder {
                found.push(quoted());
            }
            continue;
        }
        let pointed = i
            .checked_sub(1)
            .and_then(|p| words.get(p))
            .filter(|_| word.preceded_by == " ")
            .is_some_and(|p| POINTING_WORDS.contains(&p.text.to_ascii_lowercase().as_str()));
        let followed = next.is_some_and(|n| {
            FOLLOWING_WORDS.contains(&n.text.to_ascii_lowercase().as_str())
                && matches!(n.preceded_by, " " | "'" | "\u{2019}")
        });
        if followed_by_number || followed {
            found.push(quoted());
        } else if pointed {
            let p = &words[i - 1];
            found.push(line[p.start..word.start + word.text.len()].to_string());
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::history_references;

    #[test]
    fn numbered_and_pointed_history_is_found() {
        for (line, expected) in [
            ("rerun in session 12, each", "session 12"),
            ("was rerun in sessions 14 and 15 from", "sessions 14"),
            ("## Session 5: starved sockets", "Session 5"),
            ("gives the session-5 setting", "session-5"),
            ("the bench's default since session 7.", "session 7"),
            ("a fix (round 7) made", "round 7"),
            ("Round 3 changed the table", "Round 3"),
            ("in rounds 1 and 2 of the project", "rounds 1"),
            ("**Fix (this session):** busy", "this session"),
            ("the binary of the session's start", "session's"),
            ("the binary of the session start", "session start"),
            (
                "continued with `--resume` (over two sessions), so",
                "two sessions",
            ),
            (
                "a machine that earlier sessions or runs have used",
                "earlier sessions",
            ),
        ] {
            assert_eq!(
                history_references(line),
                vec![expected.to_string()],
                "{line}"
            );
        }
    }

    #[test]
    fn the_benchmark_term_and_protocol_sessions_pass() {
        for line in [
            "sudo target/release/midway-bench --rounds 3 --connections 8000 --hold 60",
            "3 rounds: medians over the rounds, throughput as median (min-max)",
            "10 s per run, 3 round(s), both midways at nice -10",
            "Each round runs every case in turn, so the three runs",
            "the ratio to direct is taken within each round; the first round only",
            "the median of the per-round ratio to direct",
            "`sudo scripts/bench-ab ROUNDS STREAMS SECONDS BINARY...`",
            "costs about one round trip; the round-trip time over the remote connection",
            "no SNI, no session resumption: every connection is a full handshake",
            "no shared table, no synchronisation, no sticky-session state",
            "In one manual session of 4 pages, keep-alive cuts the connections",
            "Two alternated rounds of 8 s, 100 and 1000 streams; three rounds each",
            "| case | streams | rounds | Gbit/s |",
            "of 4 rounds was 30 % worse, the next 3 rounds 15 % better",
        ] {
            assert!(
                history_references(line).is_empty(),
                "{line}: {:?}",
                history_references(line)
            );
        }
    }
}
