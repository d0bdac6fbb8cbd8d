//! The GPU's state through NVML (libnvidia-ml.so.1, loaded at run time like libcuda, so flashtune builds and runs without it): clocks, temperature, power, throttle reasons and counters, and the other compute processes on the GPU.
use crate::model::protocol::{GpuProcess, GpuState};
use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::enum_wrappers::device::{Clock, PerformancePolicy, TemperatureSensor};
use nvml_wrapper::Nvml;
use std::collections::BTreeSet;

/// NVML, opened before the worker's CUDA context exists, with the compute processes it saw then.
pub struct Before {
    nvml: Nvml,
    pids: BTreeSet<u32>,
}

/// Open NVML and note every compute process on every GPU, before this worker has a context: the
/// process that appears with the context is the worker, whatever pid NVML gives it (in a container
/// NVML shows the host's pids, not the worker's own).
pub fn before_context() -> Result<Before, String> {
    let nvml = Nvml::init().map_err(|e| format!("NVML cannot be loaded or started: {e}"))?;
    let count = nvml.device_count().map_err(|e| format!("NVML: {e}"))?;
    let mut pids = BTreeSet::new();
    for i in 0..count {
        if let Ok(d) = nvml.device_by_index(i) {
            if let Ok(procs) = d.running_compute_processes() {
                pids.extend(procs.iter().map(|p| p.pid));
            }
        }
    }
    Ok(Before { nvml, pids })
}

/// Reads one GPU's state for the worker that holds it.
pub struct Watch {
    nvml: Nvml,
    index: u32,
    /// The worker as NVML lists it: its own pid, or the process that came with its context.
    own: BTreeSet<u32>,
    /// Power and thermal violation counters (ns) when the timed replays began.
    mark: (Option<u64>, Option<u64>),
}

impl Watch {
    /// The NVML device at this PCI address (domain, bus, device), found once the context exists.
    pub fn open(before: Before, pci: (u32, u32, u32)) -> Result<Watch, String> {
        let Before { nvml, pids } = before;
        let count = nvml.device_count().map_err(|e| format!("NVML: {e}"))?;
        let index = (0..count)
            .find(|&i| {
                nvml.device_by_index(i)
                    .and_then(|d| d.pci_info())
                    .is_ok_and(|p| (p.domain, p.bus, p.device) == pci)
            })
            .ok_or_else(|| {
                format!(
                    "NVML shows no GPU at PCI {:04x}:{:02x}:{:02x}",
                    pci.0, pci.1, pci.2
                )
            })?;
        let me = std::process::id();
        let now: BTreeSet<u32> = nvml
            .device_by_index(index)
            .and_then(|d| d.running_compute_processes())
            .map(|ps| ps.iter().map(|p| p.pid).collect())
            .unwrap_or_default();
        let own = if now.contains(&me) {
            BTreeSet::from([me])
        } else {
            now.difference(&pids).copied().collect()
        };
        Ok(Watch {
            nvml,
            index,
            own,
            mark: (None, None),
        })
    }

    fn violations(&self) -> (Option<u64>, Option<u64>) {
        let Ok(d) = self.nvml.device_by_index(self.index) else {
            return (None, None);
        };
        let ns = |p| d.violation_status(p).ok().map(|v| v.violation_time);
        (ns(PerformancePolicy::Power), ns(PerformancePolicy::Thermal))
    }

    /// The timed replays start: note the violation counters.
    pub fn begin(&mut self) {
        self.mark = self.violations();
    }

    /// The state now, the throttling since `begin` counted in milliseconds.
    pub fn read(&mut self) -> Result<GpuState, String> {
        let (power_ns, thermal_ns) = self.violations();
        let since =
            |now: Option<u64>, then: Option<u64>| Some(now?.saturating_sub(then?) as f64 / 1e6);
        let d = self
            .nvml
            .device_by_index(self.index)
            .map_err(|e| format!("NVML: {e}"))?;
        let reasons = d
            .current_throttle_reasons()
            .map(throttle_names)
            .unwrap_or_default();
        let other_processes = d
            .running_compute_processes()
            .map(|ps| {
                ps.into_iter()
                    .filter(|p| !self.own.contains(&p.pid))
                    .map(|p| GpuProcess {
                        pid: p.pid,
                        used_bytes: match p.used_gpu_memory {
                            nvml_wrapper::enums::device::UsedGpuMemory::Used(b) => Some(b),
                            nvml_wrapper::enums::device::UsedGpuMemory::Unavailable => None,
                        },
                    })
                    .collect()
            })
            .unwrap_or_default();
        Ok(GpuState {
            sm_clock_mhz: d.clock_info(Clock::SM).ok(),
            mem_clock_mhz: d.clock_info(Clock::Memory).ok(),
            temperature_c: d.temperature(TemperatureSensor::Gpu).ok(),
            power_w: d.power_usage().ok().map(|mw| mw as f64 / 1000.0),
            throttle_reasons: reasons,
            power_violation_ms: since(power_ns, self.mark.0),
            thermal_violation_ms: since(thermal_ns, self.mark.1),
            other_processes,
        })
    }
}

/// NVML's throttle reasons by the names the log uses; idling and the clock settings are not throttling.
fn throttle_names(r: ThrottleReasons) -> Vec<String> {
    [
        (ThrottleReasons::SW_POWER_CAP, "sw_power_cap"),
        (ThrottleReasons::HW_SLOWDOWN, "hw_slowdown"),
        (ThrottleReasons::SYNC_BOOST, "sync_boost"),
        (ThrottleReasons::SW_THERMAL_SLOWDOWN, "sw_thermal_slowdown"),
        (ThrottleReasons::HW_THERMAL_SLOWDOWN, "hw_thermal_slowdown"),
        (
            ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN,
            "hw_power_brake_slowdown",
        ),
    ]
    .into_iter()
    .filter(|(bit, _)| r.contains(*bit))
    .map(|(_, name)| name.to_owned())
    .collect()
}
