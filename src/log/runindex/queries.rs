//! What the readers ask of a built index: a case, the ranking and pick per shape, disqualifying faults, the drift sentinels around a case, and how close two cases are.
use super::{sentinel_gap, spread, Case, Closeness, Fault, Pick, RunIndex, SentinelPoint};
use crate::log::runlog::Record;
use crate::model::config::Dtype;
use crate::model::space::Params;
use std::collections::BTreeMap;

impl<'a> RunIndex<'a> {
    pub fn case(&self, variant: &str, shape: &str, dtype: Dtype) -> Option<&Case<'a>> {
        self.by_key
            .get(&(variant, shape, dtype))
            .map(|&i| &self.cases[i])
    }

    /// The parameters a variant was planned with (its last `planned` record).
    pub fn params_of(&self, variant: &str) -> Option<&'a Params> {
        self.planned
            .iter()
            .rev()
            .find(|p| p.variant == variant)
            .map(|p| p.params)
    }

    /// The run's last word is not a `finished` record: interrupted, killed, or still going.
    pub fn unfinished(&self) -> bool {
        match (self.finished, self.interrupted) {
            (None, _) => true,
            (Some(f), Some((line, _))) => line > f.line,
            (Some(_), None) => false,
        }
    }

    pub fn fake(&self) -> bool {
        self.header.is_some_and(|h| h.device.fake)
    }

    /// The measured cases of one (shape, dtype), fastest median first (plan order among equals).
    pub fn ranked(&self, shape: &str, dtype: Dtype) -> Vec<&Case<'a>> {
        let mut ranked: Vec<&Case<'a>> = self
            .cases
            .iter()
            .filter(|c| c.shape.name == shape && c.dtype == dtype && c.measured().is_some())
            .filter(|c| self.disqualified_on(c.variant, shape).is_none())
            .collect();
        ranked.sort_by(|a, b| {
            let median = |c: &Case| c.measured().map_or(f64::INFINITY, |t| t.median_us);
            median(a).total_cmp(&median(b))
        });
        ranked
    }

    /// Why a variant may not be anyone's champion anywhere: its first runtime fault (a wrong answer,
    /// a crash, a hang, a write outside its outputs, a quarantine, a figure beyond the roofs) on any
    /// case, even one a retry later measured. A kernel that faults on one shape is a faulty kernel;
    /// its clean runs elsewhere are luck of the shape.
    pub fn disqualified(&self, variant: &str) -> Option<&Fault<'a>> {
        self.faults.iter().find(|f| f.variant == variant)
    }

    /// Why a variant may not be the champion of `shape`: as [`RunIndex::disqualified`], except that
    /// under per-shape dispatch only a fault on that shape (or on no named case) counts.
    pub fn disqualified_on(&self, variant: &str, shape: &str) -> Option<&Fault<'a>> {
        self.faults
            .iter()
            .find(|f| f.variant == variant && f.bars(shape, self.per_shape_dispatch))
    }

    /// **The champion rule**, the only one: every report, export, stage, search round, duel and
    /// ablation that names a run's champion asks here. Of one (shape, dtype): the fastest measured
    /// case by median, passing over a variant with a runtime fault ([`RunIndex::disqualified_on`]);
    /// cases measured under a condition (throttling, another process) are passed over when a clean
    /// one exists; and a case that lost its last duel with another candidate (a search round's
    /// interleaved re-timing, or a drift duel) ranks below that one. Also says whether the
    /// runner-up ties the champion.
    pub fn pick(&self, shape: &str, dtype: Dtype) -> Option<Pick<'_, 'a>> {
        let ranked = self.ranked(shape, dtype);
        let clean: Vec<&Case<'a>> = ranked
            .iter()
            .copied()
            .filter(|c| c.conditions().is_empty())
            .collect();
        let pool = if clean.is_empty() { &ranked } else { &clean };
        let losses = self.duel_losses(shape, dtype);
        let lost_to_one_of = |c: &Case, among: &[&Case]| {
            among
                .iter()
                .any(|o| losses.contains(&(c.variant, o.variant)))
        };
        // A ratio of two medians timed on two chips is not a ratio of kernels: each GPU's cases
        // rank among themselves, and only a duel on one GPU orders the GPUs' leaders.
        let mut gpus: Vec<(Option<String>, Vec<&Case<'a>>)> = Vec::new();
        for &c in pool.iter() {
            let placed = self.placed_of(c);
            match gpus.iter_mut().find(|(p, _)| *p == placed) {
                Some((_, cases)) => cases.push(c),
                None => gpus.push((placed, vec![c])),
            }
        }
        let leaders: Vec<&Case<'a>> = gpus
            .iter()
            .filter_map(|(_, cases)| {
                cases
                    .iter()
                    .copied()
                    .find(|c| !lost_to_one_of(c, cases))
                    .or_else(|| cases.first().copied())
            })
            .collect();
        let mut leaders_ranked = leaders.clone();
        leaders_ranked.sort_by(|a, b| {
            let median = |c: &Case| c.measured().map_or(f64::INFINITY, |t| t.median_us);
            median(a).total_cmp(&median(b))
        });
        let best = leaders_ranked
            .iter()
            .copied()
            .find(|c| !lost_to_one_of(c, &leaders_ranked))
            .or_else(|| leaders_ranked.first().copied())?;
        let unmet_leaders = leaders_ranked
            .iter()
            .copied()
            .filter(|c| !std::ptr::eq(*c, best))
            .filter(|c| !self.met(shape, dtype, best.variant, c.variant))
            .collect();
        let runner_up = pool.iter().copied().find(|c| !std::ptr::eq(*c, best));
        let tie = runner_up
            .and_then(|r| self.closeness(best, r))
            .filter(Closeness::tied);
        let best_us = best.measured().map_or(f64::INFINITY, |t| t.median_us);
        let passed_over = ranked
            .iter()
            .copied()
            .filter(|c| {
                !c.conditions().is_empty()
                    && best.conditions().is_empty()
                    && c.measured().is_some_and(|t| t.median_us < best_us)
            })
            .collect();
        let outdueled = pool
            .iter()
            .copied()
            .take_while(|c| !std::ptr::eq(*c, best))
            .filter(|c| losses.iter().any(|(loser, _)| *loser == c.variant))
            .collect();
        Some(Pick {
            best,
            runner_up,
            tie,
            passed_over,
            outdueled,
            unmet_leaders,
        })
    }

    /// The champion of every (shape, dtype) the run measured, by [`RunIndex::pick`].
    pub fn champions(&self) -> BTreeMap<(&'a str, Dtype), &Case<'a>> {
        let mut out = BTreeMap::new();
        for c in self.cases.iter().filter(|c| c.measured().is_some()) {
            let key = (c.shape.name.as_str(), c.dtype);
            if !out.contains_key(&key) {
                if let Some(p) = self.pick(key.0, key.1) {
                    out.insert(key, p.best);
                }
            }
        }
        out
    }

    /// The run's champion, the variant an ablation explains: the one [`RunIndex::pick`] makes
    /// champion of the most (shape, dtype) cases, ties broken by the geometric mean of its medians
    /// over the cases it was measured on, then by name.
    pub fn run_champion(&self) -> Option<&'a str> {
        let mut wins: BTreeMap<&'a str, usize> = BTreeMap::new();
        for c in self.champions().values() {
            *wins.entry(c.variant).or_default() += 1;
        }
        let geomean = |variant: &str| {
            let logs: Vec<f64> = self
                .cases
                .iter()
                .filter(|c| c.variant == variant)
                .filter_map(|c| c.measured())
                .map(|t| t.median_us.ln())
                .collect();
            (logs.iter().sum::<f64>() / logs.len().max(1) as f64).exp()
        };
        wins.into_iter()
            .max_by(|(a, na), (b, nb)| {
                na.cmp(nb)
                    .then_with(|| geomean(b).total_cmp(&geomean(a)))
                    .then_with(|| b.cmp(a))
            })
            .map(|(v, _)| v)
    }

    /// Whether two variants have met in an interleaved duel on one GPU on (shape, dtype): a drift
    /// duel or a search round's, whatever it found (a duel that failed is not run again).
    pub fn met(&self, shape: &str, dtype: Dtype, a: &str, b: &str) -> bool {
        let pair = |x: &str, y: &str| (x == a && y == b) || (x == b && y == a);
        self.drift_duels
            .iter()
            .any(|d| d.shape == shape && d.dtype == dtype && pair(d.champion, d.runner_up))
            || self.search.iter().any(|(_, record)| {
                matches!(record, Record::SearchDuel { shape: s, dtype: d, champion, challenger, .. }
                    if s == shape && *d == dtype && pair(champion, challenger))
            })
    }

    /// (loser, winner) of the last duel between each pair of variants on one (shape, dtype). A
    /// search round's duel keeps the holder unless the challenger was accepted (a duel that failed
    /// to run accepts nobody); a drift duel moves the title only on a verdict beyond its noise.
    fn duel_losses(&self, shape: &str, dtype: Dtype) -> Vec<(&'a str, &'a str)> {
        let mut last: BTreeMap<(&'a str, &'a str), (usize, Option<(&'a str, &'a str)>)> =
            BTreeMap::new();
        let mut settle = |line: usize, a: &'a str, b: &'a str, loss: Option<(&'a str, &'a str)>| {
            let pair = if a < b { (a, b) } else { (b, a) };
            if last.get(&pair).is_none_or(|(at, _)| *at < line) {
                last.insert(pair, (line, loss));
            }
        };
        for (line, record) in &self.search {
            if let Record::SearchDuel {
                shape: s,
                dtype: d,
                champion,
                challenger,
                verdict,
                ..
            } = record
            {
                if s == shape && *d == dtype {
                    let accepted = verdict.as_ref().is_some_and(|v| v.accept);
                    let loss = if accepted {
                        (champion.as_str(), challenger.as_str())
                    } else {
                        (challenger.as_str(), champion.as_str())
                    };
                    settle(*line, champion, challenger, Some(loss));
                }
            }
        }
        for d in self
            .drift_duels
            .iter()
            .filter(|d| d.shape == shape && d.dtype == dtype)
        {
            // The verdict judges the runner-up as the challenger.
            let loss = d.verdict.and_then(|v| {
                if v.accept {
                    Some((d.champion, d.runner_up))
                } else if v.gain < 0.0 && -v.gain > v.noise {
                    Some((d.runner_up, d.champion))
                } else {
                    None
                }
            });
            settle(d.line, d.champion, d.runner_up, loss);
        }
        last.into_values().filter_map(|(_, loss)| loss).collect()
    }

    /// The sentinels of a measured case's GPU just before and after it was timed (its last timing).
    pub fn sentinels_around(
        &self,
        case: &Case,
    ) -> (Option<&SentinelPoint<'a>>, Option<&SentinelPoint<'a>>) {
        let Some(line) = case.outcome.line() else {
            return (None, None);
        };
        let Some(t) = self.timings.iter().find(|t| t.line == line) else {
            return (None, None);
        };
        let at = |i: Option<usize>| i.and_then(|i| self.sentinels.get(i));
        (at(t.sentinel_before), at(t.sentinel_after))
    }

    /// The GPU a measured case was timed on (its last timing): its Slurm step's `node:gpuN`, else
    /// this host's `GPU n`; `None` where the log does not say.
    pub fn placed_of(&self, case: &Case) -> Option<String> {
        let line = case.outcome.line()?;
        let t = self.timings.iter().find(|t| t.line == line)?;
        t.placed
            .map(str::to_owned)
            .or_else(|| t.device.map(|d| format!("GPU {d}")))
    }

    /// How far apart the sentinel stood when two measured cases were timed: the larger gap of their
    /// sentinels before, and of their sentinels after; `None` without sentinels around both.
    pub fn drift_between(&self, a: &Case, b: &Case) -> Option<f64> {
        let (a0, a1) = self.sentinels_around(a);
        let (b0, b1) = self.sentinels_around(b);
        let gap = |x: Option<&SentinelPoint>, y: Option<&SentinelPoint>| {
            let (x, y) = (x?, y?);
            if x.error.is_some() || y.error.is_some() {
                return None;
            }
            sentinel_gap(x.figures, y.figures)
        };
        match (gap(a0, b0), gap(a1, b1)) {
            (Some(g), Some(h)) => Some(g.max(h)),
            (g, h) => g.or(h),
        }
    }

    /// Each GPU's sentinels against its first good one: (point, drift from the first).
    pub fn sentinel_drift(&self) -> Vec<(&SentinelPoint<'a>, f64)> {
        let mut first: BTreeMap<u32, &SentinelPoint<'a>> = BTreeMap::new();
        let mut out = Vec::new();
        for s in self.sentinels.iter().filter(|s| s.error.is_none()) {
            let reference = *first.entry(s.device).or_insert(s);
            if let Some(gap) = sentinel_gap(s.figures, reference.figures) {
                out.push((s, gap));
            }
        }
        out
    }

    /// How close two measured cases of one (shape, dtype) are: by the last interleaved duel of the
    /// two where the log has one with a verdict, else by their medians against their spreads.
    pub fn closeness(&self, a: &Case, b: &Case) -> Option<Closeness> {
        let (ta, tb) = (a.measured()?, b.measured()?);
        let duel = self.duels.iter().rev().find(|d| {
            d.shape == a.shape.name
                && d.dtype == a.dtype
                && d.verdict.is_some()
                && d.challenger.is_some_and(|c| {
                    (d.champion == a.variant && c == b.variant)
                        || (d.champion == b.variant && c == a.variant)
                })
        });
        if let Some(d) = duel {
            let v = d.verdict.expect("filtered on a verdict");
            return Some(Closeness {
                gap: v.gain.abs(),
                noise: v.noise,
                duel_line: Some(d.line),
            });
        }
        let (fast, slow) = if ta.median_us <= tb.median_us {
            (ta, tb)
        } else {
            (tb, ta)
        };
        Some(Closeness {
            gap: slow.median_us / fast.median_us - 1.0,
            noise: spread(ta).max(spread(tb)),
            duel_line: None,
        })
    }
}
