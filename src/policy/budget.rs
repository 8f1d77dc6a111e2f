//! A read's time budget split between its rungs: the first attempt gets a share of it (at
//! most `attempt_limit`), so that a time limit on a stuck secondary arrives while there is
//! still time for the next rung (`available`, or the primary) inside the client's own
//! `maxTimeMS` and the namespace's `max_time`.
//!
//! Pure functions over numbers; `decide` calls [`attempt_budget`], the reply side
//! [`next_rung_ms`].

use std::time::Duration;

/// The time limits of one read's attempts, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttemptBudget {
    /// `maxTimeMS` to write on the first attempt; `None` leaves the read as the client sent
    /// it (no rewrite needed).
    pub first_ms: Option<i64>,
    /// The read's whole budget: the smaller of the client's `maxTimeMS` (when above 0) and
    /// `max_time`. `None`: no limit at all.
    pub total_ms: Option<i64>,
}

fn ms(d: Duration) -> i64 {
    d.as_millis().min(i64::MAX as u128) as i64
}

/// Splits a read's budget. `client_ms` is the client's `maxTimeMS` (0 or absent: none);
/// `max_time` the namespace's cap; `share` in (0, 1]; `limit` the longest first attempt
/// (`None`: `attempt_limit = "off"`).
///
/// - with a budget `t`: the first attempt gets `min(t * share, limit)` (at least 1 ms, at
///   most `t`);
/// - without one: the first attempt gets `limit` (none when off), and the next rung has no
///   limit.
pub fn attempt_budget(
    client_ms: Option<i64>,
    max_time: Option<Duration>,
    share: f64,
    limit: Option<Duration>,
) -> AttemptBudget {
    let client = client_ms.filter(|&c| c > 0);
    let cap = max_time.map(ms);
    let total = match (client, cap) {
        (Some(c), Some(m)) => Some(c.min(m)),
        (c, m) => c.or(m),
    };
    let limit = limit.map(|l| ms(l).max(1));
    let first = match (total, limit) {
        // `as` saturates; the product is finite for a share in (0, 1].
        (Some(t), _) => {
            let share = ((t as f64 * share).floor() as i64).clamp(1, t);
            Some(limit.map_or(share, |l| share.min(l)))
        }
        (None, limit) => limit,
    };
    AttemptBudget {
        first_ms: first.filter(|&f| client != Some(f)),
        total_ms: total,
    }
}

/// What the next rung of a read may spend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Remaining {
    /// The read has no budget: no limit.
    Unbounded,
    /// The rest of the budget, in milliseconds (above 0).
    Ms(i64),
    /// Nothing left: the client's own time limit has passed, answering now would be too
    /// late.
    Spent,
}

impl Remaining {
    /// The next rung's `maxTimeMS`, `None` for no limit (`Spent` has no next rung).
    pub fn ms(self) -> Option<i64> {
        match self {
            Remaining::Ms(ms) => Some(ms),
            Remaining::Unbounded | Remaining::Spent => None,
        }
    }
}

/// What the next rung of a read may spend after `elapsed` of its budget `total_ms`.
pub fn next_rung_ms(total_ms: Option<i64>, elapsed: Duration) -> Remaining {
    match total_ms {
        None => Remaining::Unbounded,
        Some(t) => match t.saturating_sub(ms(elapsed)) {
            left if left > 0 => Remaining::Ms(left),
            _ => Remaining::Spent,
        },
    }
}

/// The `maxTimeMS` of a middle rung (the primary, with `available` after it): a share of
/// what is left, as the first attempt's share of the whole (`remaining` `None`: no budget,
/// so `limit`, or no limit when off).
pub fn rung_share(remaining: Option<i64>, share: f64, limit: Option<Duration>) -> Option<i64> {
    attempt_budget(remaining, None, share, limit)
        .first_ms
        .or(remaining)
}

/// The primary rung's time limit when neither the read nor `attempt_limit` bounds it (no
/// `maxTimeMS`, no `max_time`, `attempt_limit = "off"`): a primary read is never sent
/// without a limit, so a guard slot always comes back and the primary is never left with
/// reads nobody waits for.
pub const PRIMARY_RUNG_CEILING_MS: i64 = 5_000;

/// The `maxTimeMS` of the primary rung: never unbounded. `remaining` is what the read has
/// left of its budget (`None`: it had none); `then_available`: the `available` rung follows
/// (fallback), so the primary takes only a share, as the first attempt did.
///
/// - with a budget: all of what is left (strict, the last rung), or
///   `min(left * share, limit)` with `available` after it;
/// - without one, with `available` after it: `attempt_limit` (the `available` resend has no
///   limit), or [`PRIMARY_RUNG_CEILING_MS`] when it is off;
/// - without one, as the last rung: [`PRIMARY_RUNG_CEILING_MS`], or `attempt_limit` when
///   longer. staleguard's own short limit there would fail an honest read slower than it
///   (a 1.2 s report) that the primary would have answered, where mongos straight would
///   have served it whenever it met a healthy secondary.
pub fn primary_rung_ms(
    remaining: Option<i64>,
    then_available: bool,
    share: f64,
    limit: Option<Duration>,
) -> i64 {
    let limit_ms = limit.map(|l| ms(l).max(1));
    match remaining.filter(|&t| t > 0) {
        Some(t) if then_available => rung_share(Some(t), share, limit).unwrap_or(t),
        Some(t) => t,
        None if then_available => limit_ms.unwrap_or(PRIMARY_RUNG_CEILING_MS),
        None => limit_ms.map_or(PRIMARY_RUNG_CEILING_MS, |l| l.max(PRIMARY_RUNG_CEILING_MS)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HALF: f64 = 0.5;
    const LIMIT: Option<Duration> = Some(Duration::from_millis(500));

    fn b(client: Option<i64>, cap: Option<u64>) -> AttemptBudget {
        attempt_budget(client, cap.map(Duration::from_millis), HALF, LIMIT)
    }

    #[test]
    fn a_client_budget_is_shared() {
        // 600 ms: the first attempt gets half, the next rung what is left of 600.
        assert_eq!(
            b(Some(600), None),
            AttemptBudget {
                first_ms: Some(300),
                total_ms: Some(600)
            }
        );
        // A large budget: the first attempt stops at attempt_limit.
        assert_eq!(
            b(Some(30_000), None),
            AttemptBudget {
                first_ms: Some(500),
                total_ms: Some(30_000)
            }
        );
    }

    #[test]
    fn max_time_caps_the_budget() {
        // The cap is the whole budget when below the client's, and when the client has none.
        assert_eq!(
            b(Some(10_000), Some(400)),
            AttemptBudget {
                first_ms: Some(200),
                total_ms: Some(400)
            }
        );
        assert_eq!(
            b(None, Some(400)),
            AttemptBudget {
                first_ms: Some(200),
                total_ms: Some(400)
            }
        );
        // The client's smaller value wins over the cap.
        assert_eq!(b(Some(100), Some(400)).total_ms, Some(100));
    }

    #[test]
    fn no_budget_gets_the_attempt_limit() {
        assert_eq!(
            b(None, None),
            AttemptBudget {
                first_ms: Some(500),
                total_ms: None
            }
        );
        // maxTimeMS 0 means "no limit".
        assert_eq!(b(Some(0), None), b(None, None));
        assert_eq!(b(Some(-5), None), b(None, None));
    }

    #[test]
    fn nothing_to_write_when_the_first_attempt_is_the_clients_own() {
        // share 1 and a limit above the budget: the client's value stands, no rewrite.
        let whole = attempt_budget(Some(300), None, 1.0, Some(Duration::from_secs(1)));
        assert_eq!(
            whole,
            AttemptBudget {
                first_ms: None,
                total_ms: Some(300)
            }
        );
        // A tiny budget never becomes 0 (which would mean "no limit").
        assert_eq!(b(Some(1), None).first_ms, None);
        assert_eq!(b(None, Some(1)).first_ms, Some(1));
        assert_eq!(
            attempt_budget(Some(3), None, 0.1, LIMIT).first_ms,
            Some(1),
            "floor(0.3) is raised to 1 ms"
        );
    }

    #[test]
    fn attempt_limit_off() {
        // No budget and no limit: the read goes as the client sent it.
        assert_eq!(
            attempt_budget(None, None, 0.5, None),
            AttemptBudget {
                first_ms: None,
                total_ms: None
            }
        );
        // With a budget, only the share applies.
        assert_eq!(
            attempt_budget(Some(30_000), None, 0.5, None).first_ms,
            Some(15_000)
        );
        // Share 1 and no limit: everything as before the split.
        assert_eq!(attempt_budget(Some(800), None, 1.0, None).first_ms, None);
        assert_eq!(
            attempt_budget(None, Some(Duration::from_millis(400)), 1.0, None).first_ms,
            Some(400)
        );
    }

    #[test]
    fn a_middle_rung_takes_a_share_of_what_is_left() {
        assert_eq!(rung_share(Some(800), HALF, LIMIT), Some(400));
        assert_eq!(rung_share(Some(4000), HALF, LIMIT), Some(500));
        assert_eq!(rung_share(Some(1), HALF, LIMIT), Some(1));
        // Share 1 and no limit: all of it, still written.
        assert_eq!(rung_share(Some(300), 1.0, None), Some(300));
        assert_eq!(rung_share(None, HALF, LIMIT), Some(500));
        assert_eq!(rung_share(None, HALF, None), None);
    }

    #[test]
    fn the_primary_rung_is_never_unbounded() {
        let off = None;
        let ceiling = PRIMARY_RUNG_CEILING_MS;
        /// (remaining, `available` after it, share, attempt_limit, expected maxTimeMS)
        type Row = (Option<i64>, bool, f64, Option<Duration>, i64);
        let table: [Row; 13] = [
            // Strict, the last rung: what the read had left, whatever the limit.
            (Some(9_500), false, HALF, LIMIT, 9_500),
            (Some(9_500), false, HALF, off, 9_500),
            (Some(1), false, HALF, LIMIT, 1),
            // No budget, the last rung: the ceiling, or attempt_limit when longer.
            (None, false, HALF, LIMIT, ceiling),
            (None, false, HALF, Some(Duration::from_secs(2)), ceiling),
            (None, false, HALF, Some(Duration::from_secs(8)), 8_000),
            (None, false, HALF, off, ceiling),
            (Some(0), false, HALF, off, ceiling),
            // Fallback, `available` after it: a share of what is left, at most the limit.
            (Some(9_500), true, HALF, LIMIT, 500),
            (Some(800), true, HALF, LIMIT, 400),
            (Some(800), true, 1.0, off, 800),
            (None, true, HALF, LIMIT, 500),
            (None, true, HALF, off, ceiling),
        ];
        for (remaining, then_available, share, limit, want) in table {
            assert_eq!(
                primary_rung_ms(remaining, then_available, share, limit),
                want,
                "{remaining:?} {then_available} {share} {limit:?}"
            );
        }
        // A tiny limit is still a limit (0 would mean none to the server).
        assert_eq!(
            primary_rung_ms(None, true, HALF, Some(Duration::from_micros(10))),
            1
        );
    }

    #[test]
    fn next_rung_spends_what_is_left() {
        assert_eq!(
            next_rung_ms(None, Duration::from_secs(99)),
            Remaining::Unbounded
        );
        assert_eq!(
            next_rung_ms(Some(1000), Duration::from_millis(501)),
            Remaining::Ms(499)
        );
        assert_eq!(
            next_rung_ms(Some(1000), Duration::from_millis(1000)),
            Remaining::Spent
        );
        assert_eq!(
            next_rung_ms(Some(1000), Duration::from_secs(5)),
            Remaining::Spent
        );
    }
}
