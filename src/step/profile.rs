//! The champion's profile at the start of a session's step: reused where some run log already holds
//! one of the same kernel sources on this GPU, else taken now (Nsight Compute; the test double's
//! synthetic figures on the fake GPU) and logged with the sources it is of, for the context pack.
use super::{Pairing, Session};
use crate::error::Result;
use crate::log::runlog::Record;
use crate::run::shared::{self, Events, UnitKey};
use std::collections::BTreeMap;
use std::path::PathBuf;

impl Session<'_> {
    /// Profile HEAD's champion on each case `[profile] dtypes` names, unless a log already has it.
    pub(crate) async fn profile_champions(
        &self,
        pairings: &[Pairing],
        head_cubins: &BTreeMap<UnitKey, PathBuf>,
        sources: &str,
        events: &mut Events,
    ) -> Result<()> {
        let policy = &self.project.policies.profile;
        if !policy.enabled {
            return Ok(());
        }
        let runs = self.project.paths.runs();
        for p in pairings.iter().filter(|p| policy.dtypes.contains(&p.dtype)) {
            let variant = &p.point.variant.id;
            let case = format!("{} {}", p.shape.name, p.dtype);
            if crate::pack::has_profile(
                &runs,
                &self.device.name,
                sources,
                variant,
                &p.shape.name,
                p.dtype,
            ) {
                crate::tell!("champion {variant} on {case}: profile of these sources reused");
                continue;
            }
            let key = (format!("{variant}@head"), p.dtype, p.point.head_dim);
            let seed = shared::input_seed(self.seed, &p.shape, p.dtype);
            let spec = self.case_spec(p, &head_cubins[&key], head_cubins, seed);
            let outcome = shared::profile_now(
                self.project,
                self.device,
                self.run_dir,
                variant,
                &p.shape,
                p.dtype,
                &p.point.variant.params,
                spec,
                None,
            )
            .await?;
            crate::tell!(
                "champion {variant} on {case}: {}",
                match &outcome {
                    crate::gpu::profile::ProfileOutcome::Profiled { bottlenecks, .. } =>
                        if bottlenecks.is_empty() {
                            "profiled, no bottleneck rule matched".to_owned()
                        } else {
                            format!("profiled: {}", bottlenecks.join(", "))
                        },
                    other => format!("not profiled: {other:?}"),
                }
            );
            events.emit(Record::Profiled {
                variant: variant.clone(),
                shape: p.shape.name.clone(),
                dtype: p.dtype,
                profile: outcome,
                sources: Some(sources.to_owned()),
            })?;
        }
        Ok(())
    }
}
