//! `Policies::load`: reads `policies.toml` and refuses any value a run cannot use, pointing at its key.
use super::errors::{config_error_at_key, config_error_in_shape, parse_toml, read_text};
use super::policies::{
    check_timeout, unknown_placeholders, Policies, SandboxPolicy, TargetLimits, Tolerance,
    AGENT_PLACEHOLDERS,
};
use super::shape::{Dtype, SUPPORTED_HEAD_DIMS};
use crate::error::{Error, Result};
use std::path::Path;

impl Policies {
    pub fn load(path: &Path) -> Result<(Self, String)> {
        if !path.exists() {
            let folder = path.parent().filter(|p| !p.as_os_str().is_empty());
            return Err(Error::BadInput(format!(
                "cannot read {}: no such file. flashtune reads policies.toml, variants/ and kernels/ \
                 from the project folder ({}): run it there (cd into the clone) or pass --root PATH",
                path.display(),
                folder.map_or_else(|| ".".to_owned(), |f| f.display().to_string())
            )));
        }
        let text = read_text(path)?;
        let policies: Policies = parse_toml(path, &text)?;
        policies.validate(path, &text)?;
        Ok((policies, text))
    }

    fn validate(&self, path: &Path, text: &str) -> Result<()> {
        self.check_dtypes(path, text)?;
        self.check_numbers(path, text)?;
        self.check_counts(path, text)?;
        self.check_agents(path, text)?;
        self.check_targets(path, text)?;
        self.check_shapes(path, text)?;
        self.check_guided_rules(path, text)?;
        Ok(())
    }

    /// Every listed dtype has its tolerance, and every tolerance is a positive number.
    fn check_dtypes(&self, path: &Path, text: &str) -> Result<()> {
        let fail = |key: &str, message: String| Err(config_error_at_key(path, text, key, message));
        if self.dtypes.is_empty() {
            return fail("dtypes", "at least one dtype is needed".into());
        }
        for dtype in &self.dtypes {
            if !self.tolerance.contains_key(dtype) {
                return fail(
                    "tolerance",
                    format!("no [tolerance.{dtype}] table for listed dtype {dtype}"),
                );
            }
        }
        for (dtype, tolerance) in &self.tolerance {
            for (key, value) in tolerance.limits() {
                check_number(
                    path,
                    text,
                    &format!("tolerance.{dtype}.{key}"),
                    value,
                    Bound::Positive,
                )?;
            }
        }
        Ok(())
    }

    /// Figures and timeouts within their bounds, at least one Slurm worker, sandbox paths that make sense.
    fn check_numbers(&self, path: &Path, text: &str) -> Result<()> {
        let fail = |key: &str, message: String| Err(config_error_at_key(path, text, key, message));
        let numbers = [
            (
                "measure.warmup_ms",
                self.measure.warmup_ms,
                Bound::NonNegative("no warm-up"),
            ),
            (
                "measure.min_sample_us",
                self.measure.min_sample_us,
                Bound::Positive,
            ),
            (
                "measure.cpu_reference_max_macs",
                self.measure.cpu_reference_max_macs,
                Bound::NonNegative("no shape is checked on the CPU"),
            ),
            (
                "profile.within_pct",
                self.profile.within_pct,
                Bound::NonNegative("champions only"),
            ),
            (
                "guided.min_gain",
                self.guided.min_gain,
                Bound::NonNegative("beating the noise is enough"),
            ),
            (
                "step.threshold",
                self.step.threshold,
                Bound::NonNegative("beating the noise is enough"),
            ),
            (
                "disk.min_free_gib",
                self.disk.min_free_gib,
                Bound::NonNegative("no floor"),
            ),
            (
                "sentinel.max_drift",
                self.sentinel.max_drift,
                Bound::Positive,
            ),
        ];
        for (key, value, bound) in numbers {
            check_number(path, text, key, value, bound)?;
        }
        self.timeouts.check("timeouts", path, text)?;
        check_timeout(path, text, "profile.timeout_s", self.profile.timeout_s)?;
        check_timeout(
            path,
            text,
            "step.proposer_timeout_s",
            self.step.proposer_timeout_s,
        )?;
        check_timeout(
            path,
            text,
            "slurm.start_timeout_s",
            self.slurm.start_timeout_s,
        )?;
        if self.slurm.tasks == 0 {
            return fail("slurm.tasks", "at least one worker is needed".into());
        }
        for (key, entries) in [
            ("sandbox.writable", &self.sandbox.writable),
            ("sandbox.hidden", &self.sandbox.hidden),
        ] {
            if let Some(why) = entries.iter().find_map(|e| SandboxPolicy::fault(e)) {
                return fail(key, why);
            }
        }
        Ok(())
    }

    /// Enough samples, rounds and repetitions for a median and percentiles.
    fn check_counts(&self, path: &Path, text: &str) -> Result<()> {
        let fail = |key: &str, message: String| Err(config_error_at_key(path, text, key, message));
        if self.measure.samples < 3 {
            return fail(
                "samples",
                "at least 3 samples are needed for a median and percentiles".into(),
            );
        }
        if !(1..=self.measure.samples).contains(&self.measure.verified_replays) {
            return fail(
                "verified_replays",
                format!(
                    "must be from 1 to samples ({}), not {}",
                    self.measure.samples, self.measure.verified_replays
                ),
            );
        }
        let race = self.measure.race_samples as usize;
        if race != 0 && !(3..self.measure.samples).contains(&race) {
            return fail(
                "race_samples",
                format!(
                    "must be 0 (time every case in full) or from 3 to below samples ({}), not {race}",
                    self.measure.samples
                ),
            );
        }
        if self.step.rounds < 3 {
            return fail(
                "rounds",
                "at least 3 rounds are needed for a median and percentiles".into(),
            );
        }
        if self.sentinel.reps < 3 {
            return fail(
                "sentinel.reps",
                "at least 3 timings are needed for a median and percentiles".into(),
            );
        }
        if self.guided.max_rounds == 0 {
            return fail("guided.max_rounds", "at least 1 round is needed".into());
        }
        Ok(())
    }

    /// Agents' commands name only placeholders flashtune fills; prices are not negative.
    fn check_agents(&self, path: &Path, text: &str) -> Result<()> {
        for (name, agent) in &self.agents {
            let unknown = unknown_placeholders(&agent.command);
            if !unknown.is_empty() {
                return Err(config_error_at_key(
                    path,
                    text,
                    "command",
                    format!(
                        "[agents.{name}] command names {{{}}}, which flashtune does not fill (it fills {{{}}})",
                        unknown.join("}, {"),
                        AGENT_PLACEHOLDERS.join("}, {")
                    ),
                ));
            }
        }
        for (model, price) in &self.prices {
            for (key, value) in [
                ("input_per_mtok", Some(price.input_per_mtok)),
                ("output_per_mtok", Some(price.output_per_mtok)),
                ("cached_input_per_mtok", price.cached_input_per_mtok),
                ("cache_write_per_mtok", price.cache_write_per_mtok),
            ] {
                if let Some(v) = value {
                    check_number(
                        path,
                        text,
                        &format!("prices.{model}.{key}"),
                        v,
                        Bound::NonNegative("free"),
                    )?;
                }
            }
        }
        Ok(())
    }

    /// Every build target has its limits, the default arch among them.
    fn check_targets(&self, path: &Path, text: &str) -> Result<()> {
        let fail = |key: &str, message: String| Err(config_error_at_key(path, text, key, message));
        for (arch, limits) in &self.build.targets {
            if limits.max_threads_per_block == 0 || limits.max_smem_optin_bytes == 0 {
                return fail(
                    &format!("build.targets.{arch}"),
                    "max_threads_per_block and max_smem_optin_bytes must be above 0".into(),
                );
            }
        }
        self.target_limits(&self.build.default_arch).map_err(|_| {
            config_error_at_key(
                path,
                text,
                "build.default_arch",
                format!(
                    "no [build.targets.{}] table gives the limits of the default arch",
                    self.build.default_arch
                ),
            )
        })?;
        Ok(())
    }

    /// Shapes: at least one, distinct names, supported head dims, no empty dimension, a size that fits.
    fn check_shapes(&self, path: &Path, text: &str) -> Result<()> {
        let fail = |key: &str, message: String| Err(config_error_at_key(path, text, key, message));
        if self.shapes.is_empty() {
            return fail("shapes", "at least one [[shapes]] entry is needed".into());
        }
        let mut names = std::collections::BTreeSet::new();
        for shape in &self.shapes {
            let at = |field: &str, message: String| {
                Err(config_error_in_shape(
                    path,
                    text,
                    &shape.name,
                    field,
                    message,
                ))
            };
            if !names.insert(&shape.name) {
                return at("name", format!("two shapes are named `{}`", shape.name));
            }
            if !SUPPORTED_HEAD_DIMS.contains(&shape.d) {
                return at(
                    "d",
                    format!(
                        "shape `{}`: head dim {} is not supported (64, 96, 128 or 256)",
                        shape.name, shape.d
                    ),
                );
            }
            for (field, value) in [
                ("b", shape.b),
                ("h", shape.h),
                ("sq", shape.sq),
                ("sk", shape.sk),
            ] {
                if value == 0 {
                    return at(
                        field,
                        format!(
                            "shape `{}`: {field} = 0; every dimension must be at least 1",
                            shape.name
                        ),
                    );
                }
            }
            shape.check_size().or_else(|why| at("name", why))?;
        }
        Ok(())
    }

    /// Every guided rule names a bottleneck a profile rule defines.
    fn check_guided_rules(&self, path: &Path, text: &str) -> Result<()> {
        let fail = |key: &str, message: String| Err(config_error_at_key(path, text, key, message));
        for rule in &self.guided.rules {
            if !self
                .profile
                .bottlenecks
                .iter()
                .any(|b| b.name == rule.bottleneck)
            {
                return fail(
                    "bottleneck",
                    format!(
                        "guided rule `{}` names bottleneck `{}`, which no [[profile.bottlenecks]] rule defines",
                        rule.name, rule.bottleneck
                    ),
                );
            }
        }
        Ok(())
    }
    /// The correctness limits of `dtype`; a dtype with no `[tolerance.<dtype>]` table cannot be checked.
    pub fn tolerance(&self, dtype: Dtype) -> Result<Tolerance> {
        self.tolerance.get(&dtype).copied().ok_or_else(|| {
            Error::BadInput(format!(
                "policies.toml has no [tolerance.{dtype}] table, so {dtype} results cannot be checked; add one or ask for another dtype"
            ))
        })
    }

    /// The limits of a dtype listed in `dtypes`: load refuses a listed dtype without a table.
    pub fn tolerance_for(&self, dtype: Dtype) -> Tolerance {
        self.tolerance(dtype)
            .expect("Policies::load checks every listed dtype has a [tolerance] table")
    }

    /// What a block may use on `arch` (e.g. `sm_89`), from `[build.targets]`.
    pub fn target_limits(&self, arch: &str) -> Result<TargetLimits> {
        self.build.targets.get(arch).copied().ok_or_else(|| {
            let known: Vec<&str> = self.build.targets.keys().map(String::as_str).collect();
            Error::BadInput(format!(
                "policies.toml has no [build.targets.{arch}] table (known: {}); add one with the GPU's max_threads_per_block and max_smem_optin_bytes to build for {arch}",
                known.join(", ")
            ))
        })
    }
}

/// Which values a policy number may take beside finite ones.
#[derive(Clone, Copy)]
enum Bound {
    /// Above zero.
    Positive,
    /// Zero or above; zero means what the text says.
    NonNegative(&'static str),
}

/// TOML reads `nan` and `inf` as numbers: a limit that is NaN compares false and switches its check off.
fn check_number(path: &Path, text: &str, key: &str, value: f64, bound: Bound) -> Result<()> {
    let ok = value.is_finite()
        && match bound {
            Bound::Positive => value > 0.0,
            Bound::NonNegative(_) => value >= 0.0,
        };
    if ok {
        return Ok(());
    }
    let wanted = match bound {
        Bound::Positive => "a finite number above 0".to_owned(),
        Bound::NonNegative(zero) => format!("a finite number >= 0 (0: {zero})"),
    };
    Err(config_error_at_key(
        path,
        text,
        key,
        format!("must be {wanted}, not {value}"),
    ))
}
