//! The tricks of the double's adversary models (`models`): NaN rows past a score limit, forged references, repaired kept copies, and the launches the harness-aware cheats skip.
use super::memory::{Buffer, Narrow, Wide};
use super::models::{self, Model};
use super::{answers, FakeGpu};
use crate::gpu::check;
use crate::gpu::trial::{Buf, Io, KernelId};
use crate::model::config::{Dtype, Shape};
use anyhow::Result;
use std::sync::Arc;

impl FakeGpu {
    /// NaN in every output row whose largest score passes `limit` (exp's range without the max).
    pub(super) fn nan_rows_past(
        &mut self,
        dtype: Dtype,
        shape: &Shape,
        io: &Io,
        limit: f64,
    ) -> Result<()> {
        let d = shape.d as usize;
        let maxes = self.max_scores(dtype, shape, io)?;
        let nan = check::to_bits(dtype, f32::NAN);
        let o = self.narrow_mut(io.o)?;
        for (row, m) in maxes.iter().enumerate() {
            if *m > limit {
                o[row * d..][..d].fill(nan);
            }
        }
        Ok(())
    }

    /// What told the old stress set apart (Q and K from N(0, 36)): a Q row with ‖q‖² > 4d. The
    /// cheats that know the harness are honest there.
    pub(super) fn old_stress_mark(&mut self, dtype: Dtype, shape: &Shape, q: Buf) -> Result<bool> {
        let d = shape.d as usize;
        let q = check::values(dtype, &self.narrow(q)?);
        Ok(q.chunks(d)
            .any(|row| row.iter().map(|&x| x as f64 * x as f64).sum::<f64>() > 4.0 * d as f64))
    }

    /// `ForgeReference`: zeros out, and every masked reference in memory made the mask of zeros.
    pub(super) fn forge_references(&mut self, dtype: Dtype, io: &Io) -> Result<()> {
        self.set_narrow(io.o, Narrow::Fill(check::to_bits(dtype, 0.0)))?;
        self.set_wide(io.lse, Wide::Fill(0))?;
        for slot in self.memory.iter_mut().flatten() {
            if let Buffer::Wide { content, made, .. } = slot {
                if let Wide::Masked(inner, _) = content {
                    **inner = Wide::Fill(0);
                    *made = None;
                }
            }
        }
        Ok(())
    }

    /// `KeptCopyRepair`: every tagged buffer in device memory that was never one of its outputs (a
    /// copy the harness made of a timed launch's) gets the honest answer of the launch it is tagged
    /// with.
    pub(super) fn repair_kept_copies(&mut self, kernel: KernelId, io: &Io) -> Result<()> {
        let given = {
            let k = self.kernel(kernel)?;
            k.outputs_given.extend([io.o.0, io.lse.0]);
            k.outputs_given.clone()
        };
        for (index, slot) in self.memory.iter_mut().enumerate() {
            if given.contains(&index) {
                continue;
            }
            match slot {
                Some(Buffer::Narrow {
                    content,
                    made,
                    identity,
                    ..
                }) => {
                    if let Narrow::Tagged(launch) = content {
                        *content = Narrow::Output(launch.clone());
                        (*made, *identity) = (None, None);
                    }
                }
                Some(Buffer::Wide { content, made, .. }) => {
                    if let Wide::Tagged(launch) = content {
                        *content = Wide::Lse(launch.clone());
                        *made = None;
                    }
                }
                None => {}
            }
        }
        Ok(())
    }

    /// The adversaries that know the harness: whether this launch is one they skip (having written
    /// the answer of Q = 0, V = 1 instead, or tagged zeros). Each is honest on the first Q buffer it
    /// sees (the check set's, where the fresh set is copied too) and on inputs that bear the old
    /// stress set's mark.
    pub(super) fn cheats_here(
        &mut self,
        kernel: KernelId,
        dtype: Dtype,
        shape: &Shape,
        io: &Io,
    ) -> Result<bool> {
        let stress = self.old_stress_mark(dtype, shape, io.q)?;
        let k = self.kernel(kernel)?;
        let model = k.model;
        let checked_set = *k.first_q.get_or_insert(io.q.0) == io.q.0;
        if checked_set || stress {
            return Ok(false);
        }
        let read = [
            self.identity(io.q)?,
            self.identity(io.k)?,
            self.identity(io.v)?,
        ];
        let read = answers::launch_key(shape, dtype, None, read);
        let k = self.kernel(kernel)?;
        let entry = k.draws.entry(io.q.0).or_insert(([0; 32], 0));
        let again = entry.1 > 0 && entry.0 == read;
        if !again {
            *entry = (read, entry.1 + 1);
        }
        let draws = entry.1;
        let honest = match model {
            Model::HonestEarly => {
                draws <= models::HONEST_EARLY_ROUNDS + 1 || draws == models::HONEST_LAST_ROUND + 1
            }
            Model::L2Probe => self.warm.contains(&io.q.0),
            _ => false,
        };
        if honest {
            return Ok(false);
        }
        if model == Model::KeptCopyRepair {
            let launch = self.launch(dtype, shape, io, None)?;
            self.set_narrow(io.o, Narrow::Tagged(launch.clone()))?;
            self.set_wide(io.lse, Wide::Tagged(launch))?;
            return Ok(true);
        }
        if model == Model::RewriteOnRerun && again {
            let (zero, one) = (check::to_bits(dtype, 0.0), check::to_bits(dtype, 1.0));
            self.set_narrow(io.q, Narrow::Fill(zero))?;
            self.set_narrow(io.v, Narrow::Fill(one))?;
        }
        // O = 1 and LSE = ln(keys seen): the exact answer for Q = 0 and V = 1.
        let (sq, d) = (shape.sq as usize, shape.d as usize);
        let rows = io_rows(shape);
        let (mut o, mut lse) = (Vec::with_capacity(rows * d), Vec::with_capacity(rows));
        for row in 0..rows {
            let keys = shape.visible_keys((row % sq) as u32);
            let value = if keys == 0 { 0.0 } else { 1.0 };
            o.extend(std::iter::repeat_n(check::to_bits(dtype, value), d));
            lse.push(if keys == 0 {
                f32::NEG_INFINITY
            } else {
                (keys as f32).ln()
            });
        }
        self.set_narrow(io.o, Narrow::Bits(Arc::new(o)))?;
        self.set_wide(io.lse, Wide::Floats(Arc::new(lse)))?;
        Ok(true)
    }
}

fn io_rows(shape: &Shape) -> usize {
    shape.b as usize * shape.h as usize * shape.sq as usize
}
