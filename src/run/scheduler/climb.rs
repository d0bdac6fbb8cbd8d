//! Which ready variant a free GPU takes next in a run under a time limit: the dispatch order's
//! first for the first few picks and every few after, else the variant one parameter away from the
//! best so far of the most (shape, dtype) cases (hill climbing from every case's leader at once).
//! Replayed over the figures of a run of the attention space on an H200 (`scripts/climb-replay.py`),
//! the spread order alone had every case's best after 283 s of the workers' 296 s, this one after 117 s.
use super::Bests;
use crate::error::Result;
use crate::log::runlog::{Leader, Record};
use crate::model::config::Dtype;
use crate::model::space::{differing, Params};
use crate::run::shared::Events;
use std::collections::{BTreeMap, BTreeSet};

/// Picks from the dispatch order before the first climb: leaders worth climbing from.
const SPREAD_FIRST: usize = 6;
/// After those, every this many picks the order's next: the spread keeps reaching corners no
/// leader is near.
const SPREAD_EVERY: usize = 4;

/// Ready variants weighed per pick, the order's first: a pick costs this many times the leaders'
/// count, whatever the size of the space.
const MAX_WEIGHED: usize = 4096;

/// Per variant id: its parameters and its (shape, dtype) cases.
pub(super) type Points = BTreeMap<String, (Params, BTreeSet<(String, Dtype)>)>;

/// The variants a run may climb to, and how many picks it has made.
pub(super) struct Climber {
    by_variant: Points,
    picks: usize,
}

/// What to dispatch: the index into the ready list, and the leaders it climbs from (none when the
/// order's own next is taken).
pub(super) struct Pick {
    pub(super) index: usize,
    pub(super) near: Vec<Leader>,
}

impl Climber {
    pub(super) fn new(variants: Points) -> Self {
        Climber {
            by_variant: variants,
            picks: 0,
        }
    }

    /// The next of `ready` (in dispatch order, first first) given the leaders in `bests`.
    pub(super) fn pick(&mut self, ready: &[String], bests: &Bests) -> Pick {
        self.picks += 1;
        let order = Pick {
            index: 0,
            near: Vec::new(),
        };
        if self.picks <= SPREAD_FIRST || (self.picks - SPREAD_FIRST) % SPREAD_EVERY == 0 {
            return order;
        }
        // Each leader once: its case and its parameters (a leader the climb does not know, none).
        let leaders: Vec<((String, Dtype), &Params, Leader)> = bests
            .leaders()
            .into_iter()
            .filter_map(|l| {
                let (params, _) = self.by_variant.get(&l.variant)?;
                Some(((l.shape.clone(), l.dtype), params, l))
            })
            .collect();
        let near = |(case, lp, _): &&((String, Dtype), &Params, Leader),
                    (params, cases): &(Params, BTreeSet<(String, Dtype)>)| {
            cases.contains(case) && differing(lp, params) == 1
        };
        let mut best: Option<(usize, usize)> = None;
        for (index, variant) in ready.iter().enumerate().take(MAX_WEIGHED) {
            let Some(candidate) = self.by_variant.get(variant) else {
                continue;
            };
            let count = leaders.iter().filter(|l| near(l, candidate)).count();
            // Ties go to the earlier in the order: `ready` is in it.
            if count > best.map_or(0, |b| b.1) {
                best = Some((index, count));
            }
        }
        if let Some((index, _)) = best {
            let candidate = &self.by_variant[&ready[index]];
            let near = leaders
                .iter()
                .filter(|l| near(l, candidate))
                .map(|(_, _, l)| l.clone())
                .collect();
            return Pick { index, near };
        }
        order
    }
}

/// Take the next variant off `ready` (in dispatch order): through the climber where the run has one,
/// logging a pick made for its leaders; else the order's first.
pub(super) fn next(
    climber: Option<&mut Climber>,
    ready: &mut Vec<String>,
    bests: &Bests,
    order: &[String],
    events: &mut Events,
) -> Result<String> {
    let Some(climber) = climber else {
        return Ok(ready.remove(0));
    };
    let pick = climber.pick(ready, bests);
    let variant = ready.remove(pick.index);
    if !pick.near.is_empty() {
        events.emit(Record::Climbed {
            rank: order
                .iter()
                .position(|v| *v == variant)
                .map_or(0, |r| r + 1),
            variant: variant.clone(),
            near: pick.near,
        })?;
    }
    Ok(variant)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::vocab::ParamValue;

    fn params(m: i64, n: i64) -> Params {
        [("BLOCK_M", m), ("BLOCK_N", n)]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), ParamValue::Int(v)))
            .collect()
    }

    fn climber(points: &[(&str, i64, i64)], cases: &[&str]) -> Climber {
        let all: BTreeSet<(String, Dtype)> =
            cases.iter().map(|c| (c.to_string(), Dtype::F16)).collect();
        Climber::new(
            points
                .iter()
                .map(|(id, m, n)| (id.to_string(), (params(*m, *n), all.clone())))
                .collect(),
        )
    }

    fn lead(bests: &mut Bests, variant: &str, shape: &str, median_us: f64) {
        let bar = crate::model::protocol::RaceBar {
            samples: 0,
            p90_us: median_us,
            best: variant.to_owned(),
        };
        bests
            .0
            .insert((shape.to_owned(), Dtype::F16), (median_us, bar));
    }

    #[test]
    fn after_the_spread_picks_it_climbs_from_the_most_leaders_and_every_few_picks_spreads() {
        let mut c = climber(
            &[
                ("a", 64, 64),
                ("far", 128, 128),
                ("near-a", 64, 128),
                ("near-b", 32, 32),
            ],
            &["x", "y"],
        );
        let mut bests = Bests::default();
        let ready: Vec<String> = ["far", "near-b", "near-a"].map(String::from).to_vec();
        for _ in 0..SPREAD_FIRST {
            assert_eq!(c.pick(&ready, &bests).index, 0, "the order's first");
        }
        // No leader yet: the order's first.
        assert_eq!(c.pick(&ready, &bests).index, 0);
        lead(&mut bests, "a", "x", 10.0);
        lead(&mut bests, "a", "y", 10.0);
        let pick = c.pick(&ready, &bests);
        assert_eq!(
            ready[pick.index], "near-a",
            "one parameter from a, the leader of both cases"
        );
        assert_eq!(pick.near.len(), 2);
        // The (SPREAD_EVERY)th pick after the spread ones takes the order's first again.
        let mut spread = 0;
        for _ in 0..SPREAD_EVERY {
            if c.pick(&ready, &bests).near.is_empty() {
                spread += 1;
            }
        }
        assert_eq!(spread, 1);
    }
}
