//! The report page's Plots section: the speedups, the roofline, the champions and the GPU over time.
use crate::log::runindex::RunIndex;
use crate::report::document::{Block, Figure, Section, SectionId, Swatch, Text};
use plotters::style::RGBColor;

pub(super) fn plots(ix: &RunIndex) -> Section {
    let found = crate::report::findings::best_per_shape(ix);
    let (traces, last_timed) = crate::report::findings::champion_traces(ix);
    let key = dtype_key(ix);
    let bars = "bars start at 1.0 (as fast); the label is the ratio.";
    let figures = [
        crate::report::plots::speedup(
            &found,
            "Best variant vs the fastest PyTorch SDPA backend: PyTorch's median ÷ the best's",
            |r| Some(r.fastest_torch_us? / r.best.as_ref()?.1),
        )
        .map(|f| (f, key.clone(), Some(bars.into()))),
        crate::report::plots::speedup(
            &found,
            "Best variant vs the space's baseline variant: the baseline's median ÷ the best's",
            |r| Some(r.baseline_us? / r.best.as_ref()?.1),
        )
        .map(|f| (f, key.clone(), Some(bars.into()))),
        crate::report::plots::roofline(ix, &found.ceilings).map(|f| (f, Vec::new(), None)),
        crate::report::plots::champions_over_time(&traces, last_timed).map(|f| {
            (
                f,
                Vec::new(),
                Some(Text::from("Only figures that may decide a champion: timed on a GPU neither throttled nor shared, by variants no fault bars from the shape.")),
            )
        }),
        crate::report::plots::sentinel_over_time(&crate::report::findings::sentinel_traces(ix))
            .map(|f| (f, Vec::new(), None)),
        crate::report::plots::state_over_time(&crate::report::findings::gpu_states(ix))
            .map(|f| (f, Vec::new(), None)),
        {
            let (spans, wall) = crate::report::timeline::spans(ix);
            crate::report::plots::timeline(&spans, wall).map(|f| {
                (
                    f,
                    Vec::new(),
                    Some(Text::from("A worker's and a build's spans are in their records; a stage's runs from the record before its first to its last.")),
                )
            })
        },
    ];
    let mut s = Section::new(SectionId::Plots, Text::from("Plots"));
    if figures.iter().all(Option::is_none) {
        s.push(Block::Missing(
            "No timed records in this log: nothing to plot.".into(),
        ));
        return s;
    }
    if found.rows.iter().all(|r| r.fastest_torch_us.is_none()) {
        s.push(Block::Missing(
            "PyTorch SDPA was not measured in this run: no speedup against it.".into(),
        ));
    }
    if !traces.is_empty() && traces.iter().all(|t| t.points.len() < 2) {
        s.push(Block::Missing("No champion changed during the run (each shape's first figure that could decide it stayed the best): no plot over time.".into()));
    }
    if found.ceilings.is_empty() {
        s.push(Block::Missing(
            "Ceilings not measured in this run: the roofline has no roof.".into(),
        ));
    }
    for (figure, key, caption) in figures.into_iter().flatten() {
        s.push(match figure {
            Ok(svg) => Block::Figure(Figure { svg, key, caption }),
            Err(why) => Block::Missing(format!("A plot could not be drawn: {why}").into()),
        });
    }
    s
}

/// The dtype colours of the bar charts, as a key under them (a legend inside would cover bars).
fn dtype_key(ix: &RunIndex) -> Vec<Swatch> {
    let dtypes = ix.header.map(|h| h.dtypes.clone()).unwrap_or_default();
    dtypes
        .iter()
        .map(|&d| {
            let RGBColor(r, g, b) = crate::report::plots::dtype_color(d);
            Swatch {
                rgb: (r, g, b),
                label: d.to_string(),
            }
        })
        .collect()
}
