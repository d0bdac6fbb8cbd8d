//! Less for a kernel under test to predict, beside the rule that nothing kept for a verdict stays on
//! the device (defence in depth, not a substitute for it): every choice here comes from the OS's
//! generator, never from the run's seed, so a kernel that has read this file still cannot know the
//! draw. The timed launches' inputs ([`seed`]), how many timed rounds a case runs ([`rounds`]), and
//! where this case's buffers lie relative to each other ([`Layout`]).
use super::{Buf, Device};
use anyhow::Result;
use rand::Rng;

/// A seed for the timed launches' inputs: never the run's seed, never derived from earlier inputs.
pub(super) fn seed() -> u64 {
    rand::rng().random()
}

/// How many timed rounds a case runs when `nominal` are asked for: uniform within ±20 % (at least
/// two), so no round can be known to be the last by counting.
pub fn rounds(nominal: usize) -> usize {
    if nominal < 2 {
        return nominal;
    }
    let spread = (nominal / 5).max(1);
    rand::rng()
        .random_range(nominal.saturating_sub(spread)..=nominal + spread)
        .max(2)
}

/// Largest gap [`Layout::pad`] may leave, in 16-bit elements (4 MiB).
const MAX_PAD_ELEMENTS: usize = 2 << 20;

/// The order and padding of one case's allocations: which place a group of buffers takes among
/// its siblings, and gaps of random size between them, freed when the case ends.
pub(super) struct Layout {
    pads: Vec<Buf>,
}

impl Layout {
    pub(super) fn new() -> Self {
        Layout { pads: Vec::new() }
    }

    /// A place among `n` for a group of buffers, drawn afresh per case.
    pub(super) fn place(&self, n: usize) -> usize {
        rand::rng().random_range(0..n.max(1))
    }

    /// Half the time, a gap of random size before the next allocation.
    pub(super) fn pad<D: Device>(&mut self, dev: &mut D) -> Result<()> {
        let mut rng = rand::rng();
        if rng.random_bool(0.5) {
            self.pads
                .push(dev.alloc16(rng.random_range(128..=MAX_PAD_ELEMENTS))?);
        }
        Ok(())
    }

    pub(super) fn free<D: Device>(self, dev: &mut D) {
        self.pads.into_iter().for_each(|b| dev.free(b));
    }
}
