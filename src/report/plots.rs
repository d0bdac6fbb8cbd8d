//! The report page's SVG plots (plotters, SVG backend, no font files): speedup per shape, roofline, champions over the run clock.
use crate::log::runindex::RunIndex;
use crate::model::config::Dtype;
use crate::report::findings::{self, BestPerShape, Ceilings, ChampionTrace};
use plotters::coord::ranged1d::AsRangedCoord;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor;

const WIDTH: u32 = 1100;
const HEIGHT: u32 = 480;
const FONT: &str = "sans-serif";

/// One colour per dtype, so f16 and bf16 read the same way on every plot.
pub fn dtype_color(d: Dtype) -> RGBColor {
    match d {
        Dtype::F16 => RGBColor(31, 119, 180),
        Dtype::Bf16 => RGBColor(214, 39, 40),
    }
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// Draw into a fresh SVG string; a plot that cannot be drawn becomes the reason, not a broken page.
fn svg(draw: impl FnOnce(&Area) -> Result<(), String>) -> Result<String, String> {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        draw(&root)?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(out)
}

type Chart<'a, 'b, X, Y> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<X, Y>>;

/// Every plot's frame: title, margins, room for the axis labels.
fn chart<'a, 'b, X: AsRangedCoord, Y: AsRangedCoord>(
    root: &'a Area<'b>,
    title: &str,
    x: X,
    y: Y,
) -> Result<Chart<'a, 'b, X::CoordDescType, Y::CoordDescType>, String> {
    ChartBuilder::on(root)
        .caption(title, (FONT, 20))
        .margin(12)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(x, y)
        .map_err(|e| e.to_string())
}

/// A log-scale range around `values` that always shows 1.0.
fn ratio_range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values.fold((1.0f64, 1.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    (lo / 1.25, hi * 1.25)
}

/// Bars from 1.0 to each ratio, one group per shape and one bar per dtype; `None` when no ratio exists.
pub fn speedup(
    found: &BestPerShape,
    title: &str,
    ratio: impl Fn(&findings::BestRow) -> Option<f64>,
) -> Option<Result<String, String>> {
    let mut shapes: Vec<String> = Vec::new();
    let mut dtypes: Vec<Dtype> = Vec::new();
    for r in &found.rows {
        if !shapes.contains(&r.shape.name) {
            shapes.push(r.shape.name.clone());
        }
        if !dtypes.contains(&r.dtype) {
            dtypes.push(r.dtype);
        }
    }
    let bars: Vec<(usize, usize, f64)> = found
        .rows
        .iter()
        .filter_map(|r| {
            let s = shapes.iter().position(|x| x == &r.shape.name)?;
            let d = dtypes.iter().position(|x| *x == r.dtype)?;
            Some((s, d, ratio(r)?))
        })
        .collect();
    if bars.is_empty() {
        return None;
    }
    // Drawn in log10 space on a linear axis: plotters' log axis labels no tick below 1.0.
    let (lo, hi) = ratio_range(bars.iter().map(|b| b.2));
    let width = 0.8 / dtypes.len() as f64;
    Some(svg(|root| {
        let x = -0.5..shapes.len() as f64 - 0.5;
        let mut chart = chart(root, title, x, lo.log10()..hi.log10())?;
        let name_at = |x: &f64| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 {
                shapes.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        };
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(shapes.len() + 1)
            .x_label_formatter(&name_at)
            .y_labels(12)
            .y_desc("speedup (×, log scale, higher is faster)")
            .y_label_formatter(&|y| format!("{:.2}", 10f64.powf(*y)))
            .label_style((FONT, 14))
            .light_line_style(BLACK.mix(0.04))
            .bold_line_style(BLACK.mix(0.15))
            .draw()
            .map_err(|e| e.to_string())?;
        for (di, &dtype) in dtypes.iter().enumerate() {
            let color = dtype_color(dtype);
            chart
                .draw_series(bars.iter().filter(|b| b.1 == di).map(|&(s, d, r)| {
                    let x0 = s as f64 - 0.4 + d as f64 * width;
                    Rectangle::new([(x0, 0.0), (x0 + width * 0.9, r.log10())], color.filled())
                }))
                .map_err(|e| e.to_string())?;
            chart
                .draw_series(bars.iter().filter(|b| b.1 == di).map(|&(s, d, r)| {
                    let x = s as f64 - 0.4 + (d as f64 + 0.45) * width;
                    let y = if r >= 1.0 {
                        (r * 1.02).log10()
                    } else {
                        (r / 1.02).log10()
                    };
                    Text::new(
                        format!("{r:.2}"),
                        (x, y),
                        (FONT, 12)
                            .into_font()
                            .color(&BLACK)
                            .pos(text_anchor::Pos::new(
                                text_anchor::HPos::Center,
                                if r >= 1.0 {
                                    text_anchor::VPos::Bottom
                                } else {
                                    text_anchor::VPos::Top
                                },
                            )),
                    )
                }))
                .map_err(|e| e.to_string())?;
        }
        chart
            .draw_series(LineSeries::new(
                [(-0.5, 0.0), (shapes.len() as f64 - 0.5, 0.0)],
                BLACK.stroke_width(1),
            ))
            .map_err(|e| e.to_string())?;
        Ok(())
    }))
}

fn legend<'a, 'b: 'a, X, Y>(
    chart: &mut ChartContext<'a, SVGBackend<'b>, Cartesian2d<X, Y>>,
    position: SeriesLabelPosition,
) -> Result<(), String>
where
    X: Ranged,
    Y: Ranged,
{
    chart
        .configure_series_labels()
        .position(position)
        .label_font((FONT, 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .draw()
        .map_err(|e| e.to_string())
}

/// Achieved TFLOP/s against arithmetic intensity for every timed case, under the measured roofs.
pub fn roofline(ix: &RunIndex, ceilings: &Ceilings) -> Option<Result<String, String>> {
    ix.header?;
    // Measured cases only: an implausible figure is not a point under the roof.
    let points: Vec<(Dtype, f64, f64)> = ix
        .cases
        .iter()
        .filter_map(|c| {
            Some((
                c.dtype,
                findings::arithmetic_intensity(c.shape, c.dtype),
                c.measured()?.tflops,
            ))
        })
        .collect();
    if points.is_empty() {
        return None;
    }
    let roofs: Vec<f64> = ceilings.matmul_tflops.values().map(|m| m.value).collect();
    let x_lo = points.iter().map(|p| p.1).fold(f64::INFINITY, f64::min) / 2.0;
    let x_hi = points.iter().map(|p| p.1).fold(0.0, f64::max) * 2.0;
    let y_lo = points.iter().map(|p| p.2).fold(f64::INFINITY, f64::min) / 2.0;
    let y_hi = points
        .iter()
        .map(|p| p.2)
        .chain(roofs.iter().copied())
        .fold(0.0, f64::max)
        * 2.0;
    Some(svg(|root| {
        let title =
            "Roofline: every measured case, implausible ones left out (least traffic Q+K+V+O)";
        let (x, y) = ((x_lo..x_hi).log_scale(), (y_lo..y_hi).log_scale());
        let mut chart = chart(root, title, x, y)?;
        chart
            .configure_mesh()
            .x_desc("arithmetic intensity (FLOP per byte of Q, K, V, O)")
            .y_desc("achieved TFLOP/s")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| crate::report::document::three_digits(*y))
            .label_style((FONT, 14))
            .light_line_style(BLACK.mix(0.04))
            .bold_line_style(BLACK.mix(0.15))
            .draw()
            .map_err(|e| e.to_string())?;
        // The roof: the bandwidth slope (the faster measured stream) up to each dtype's matmul ceiling (only what was measured).
        let xs: Vec<f64> = (0..=200)
            .map(|i| x_lo * (x_hi / x_lo).powf(i as f64 / 200.0))
            .collect();
        let bandwidth = ceilings.bandwidth();
        let slope = |x: f64| bandwidth.map(|m| m.value * x / 1e3);
        for (i, (dtype, roof)) in ceilings.matmul_tflops.iter().enumerate() {
            let color = dtype_color(*dtype);
            let line: Vec<(f64, f64)> = xs
                .iter()
                .map(|&x| (x, slope(x).map_or(roof.value, |s| s.min(roof.value))))
                .collect();
            // The dtypes' roofs nearly coincide; dashes keep the one drawn first visible under the next.
            let drawn = if i == 0 {
                chart.draw_series(LineSeries::new(line, color.stroke_width(2)))
            } else {
                chart.draw_series(DashedLineSeries::new(line, 10, 8, color.stroke_width(2)))
            };
            drawn
                .map_err(|e| e.to_string())?
                .label(format!(
                    "{dtype} roof: matmul {} TFLOP/s (log line {})",
                    crate::report::document::three_digits(roof.value),
                    roof.line
                ))
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2))
                });
        }
        if let (Some(copy), true) = (bandwidth, ceilings.matmul_tflops.is_empty()) {
            let line: Vec<(f64, f64)> = xs.iter().map(|&x| (x, copy.value * x / 1e3)).collect();
            chart
                .draw_series(LineSeries::new(line, BLACK.stroke_width(2)))
                .map_err(|e| e.to_string())?;
        }
        if let Some(copy) = bandwidth {
            let stream = if ceilings.read_gbs == Some(copy) {
                "read-only stream"
            } else {
                "copy"
            };
            chart
                .draw_series(std::iter::empty::<Circle<(f64, f64), i32>>())
                .map_err(|e| e.to_string())?
                .label(format!(
                    "slope: {stream} {:.0} GB/s (log line {})",
                    copy.value, copy.line
                ))
                .legend(|(x, y)| {
                    PathElement::new([(x, y + 4), (x + 16, y - 4)], BLACK.stroke_width(2))
                });
        }
        let mut dtypes: Vec<Dtype> = points.iter().map(|p| p.0).collect();
        dtypes.dedup();
        dtypes.sort();
        dtypes.dedup();
        for dtype in dtypes {
            let color = dtype_color(dtype);
            chart
                .draw_series(
                    points
                        .iter()
                        .filter(|p| p.0 == dtype)
                        .map(|p| Circle::new((p.1, p.2), 4, color.mix(0.6).filled())),
                )
                .map_err(|e| e.to_string())?
                .label(format!("{dtype} cases"))
                .legend(move |(x, y)| Circle::new((x + 8, y), 4, color.filled()));
        }
        // Slow cases sit low at low intensity, fast ones high at high intensity: the lower right stays free.
        legend(&mut chart, SeriesLabelPosition::LowerRight)
    }))
}

/// Best-so-far time of each (shape, dtype) over the run clock, as a multiple of its final champion;
/// `None` when no champion ever changed (a flat line per shape says nothing).
pub fn champions_over_time(traces: &[ChampionTrace], end_t: f64) -> Option<Result<String, String>> {
    if traces.iter().all(|t| t.points.len() < 2) {
        return None;
    }
    let normalized: Vec<(String, Vec<(f64, f64)>)> = traces
        .iter()
        .map(|tr| {
            let last = tr.points.last().map_or(1.0, |p| p.1);
            let mut steps = Vec::new();
            for (i, &(t, us)) in tr.points.iter().enumerate() {
                if i > 0 {
                    steps.push((t, tr.points[i - 1].1 / last));
                }
                steps.push((t, us / last));
            }
            steps.push((end_t * 1.04, 1.0));
            (format!("{} {}", tr.shape, tr.dtype), steps)
        })
        .collect();
    let (_, hi) = ratio_range(normalized.iter().flat_map(|n| n.1.iter().map(|p| p.1)));
    Some(svg(|root| {
        let title = "Champion over the run: best-so-far time ÷ final best";
        let x = 0.0..(end_t * 1.05).max(1e-3);
        // A log axis over less than a decade gets one plotters tick (1.00); name the ticks instead.
        let ticks: Vec<f64> = [1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 50.0, 100.0]
            .into_iter()
            .filter(|t| *t <= hi)
            .collect();
        let mut chart = chart(
            root,
            title,
            x,
            (0.95..hi).log_scale().with_key_points(ticks),
        )?;
        chart
            .configure_mesh()
            .x_desc("run clock (s)")
            .y_desc("best so far ÷ final best (1 = final)")
            .y_label_formatter(&|y| format!("{y:.2}"))
            .label_style((FONT, 14))
            .light_line_style(BLACK.mix(0.04))
            .bold_line_style(BLACK.mix(0.15))
            .draw()
            .map_err(|e| e.to_string())?;
        for (i, (name, steps)) in normalized.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(
                    steps.iter().copied(),
                    color.stroke_width(2),
                ))
                .map_err(|e| e.to_string())?
                .label(name.as_str())
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2))
                });
        }
        // Nothing is timed before the first builds land, so the upper left stays free; the right edge is where champions change.
        legend(&mut chart, SeriesLabelPosition::UpperLeft)
    }))
}

/// Each GPU's sentinel figures over the run clock as a multiple of their first, inside the band the
/// policy allows; `None` without two sentinels.
pub fn sentinel_over_time(traces: &[findings::SentinelTrace]) -> Option<Result<String, String>> {
    let lines: Vec<(String, Vec<(f64, f64)>)> = traces
        .iter()
        .flat_map(|tr| {
            tr.figures.iter().map(move |(name, first, points)| {
                (
                    format!("GPU {} {name} (first {first:.1} µs)", tr.device),
                    points.iter().map(|p| (p.0, p.1)).collect::<Vec<_>>(),
                )
            })
        })
        .filter(|(_, points)| !points.is_empty())
        .collect();
    if lines.iter().all(|l| l.1.len() < 2) {
        return None;
    }
    let limit = traces.iter().map(|t| t.max_drift).fold(0.0, f64::max);
    // Drift is slower ÷ faster - 1 (`runindex::sentinel_gap`): a sentinel faster than the first
    // passes the limit below 1 / (1 + limit), not at 1 - limit.
    let (floor, ceiling) = (1.0 / (1.0 + limit), 1.0 + limit);
    let end_t = lines
        .iter()
        .flat_map(|l| l.1.iter().map(|p| p.0))
        .fold(0.0, f64::max);
    let lo = lines
        .iter()
        .flat_map(|l| l.1.iter().map(|p| p.1))
        .fold(floor, f64::min);
    let hi = lines
        .iter()
        .flat_map(|l| l.1.iter().map(|p| p.1))
        .fold(ceiling, f64::max);
    let pad = (hi - lo) * 0.15;
    Some(svg(|root| {
        let title = "Drift sentinel over the run: time ÷ the first sentinel's";
        let x = 0.0..(end_t * 1.05).max(1e-3);
        let mut chart = chart(root, title, x, (lo - pad)..(hi + pad))?;
        chart
            .configure_mesh()
            .x_desc("run clock (s)")
            .y_desc("sentinel time ÷ first (1 = as at the start)")
            .y_label_formatter(&|y| format!("{y:.3}"))
            .label_style((FONT, 14))
            .light_line_style(BLACK.mix(0.04))
            .bold_line_style(BLACK.mix(0.15))
            .draw()
            .map_err(|e| e.to_string())?;
        for bound in [floor, ceiling] {
            chart
                .draw_series(DashedLineSeries::new(
                    [(0.0, bound), (end_t * 1.05, bound)],
                    6,
                    6,
                    BLACK.mix(0.5).stroke_width(1),
                ))
                .map_err(|e| e.to_string())?;
        }
        chart
            .draw_series(std::iter::empty::<Circle<(f64, f64), i32>>())
            .map_err(|e| e.to_string())?
            .label(format!(
                "limit: {:.1}% slower or faster than the first ([sentinel] max_drift)",
                100.0 * limit
            ))
            .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], BLACK.mix(0.5)));
        for (i, (name, points)) in lines.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(
                    points.iter().copied(),
                    color.stroke_width(2),
                ))
                .map_err(|e| e.to_string())?
                .label(name.as_str())
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2))
                });
            chart
                .draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .map_err(|e| e.to_string())?;
        }
        legend(&mut chart, SeriesLabelPosition::UpperLeft)
    }))
}

/// The SM clock (above) and the temperature (below) NVML read over the run; `None` without readings.
pub fn state_over_time(points: &[findings::StatePoint]) -> Option<Result<String, String>> {
    let sm: Vec<(f64, f64)> = points
        .iter()
        .filter_map(|p| Some((p.t, f64::from(p.sm_clock_mhz?))))
        .collect();
    let temp: Vec<(f64, f64)> = points
        .iter()
        .filter_map(|p| Some((p.t, f64::from(p.temperature_c?))))
        .collect();
    if sm.len() < 2 && temp.len() < 2 {
        return None;
    }
    let end_t = points.iter().map(|p| p.t).fold(0.0, f64::max);
    let span = |xs: &[(f64, f64)]| {
        let lo = xs.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
        let hi = xs.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
        let pad = ((hi - lo) * 0.15).max(5.0);
        (lo - pad)..(hi + pad)
    };
    Some(svg(|root| {
        let panels = root.split_evenly((2, 1));
        let series = [
            (
                "SM clock and temperature over the run: SM clock",
                "SM clock (MHz)",
                &sm,
                RGBColor(31, 119, 180),
            ),
            (
                "temperature",
                "temperature (°C)",
                &temp,
                RGBColor(214, 39, 40),
            ),
        ];
        for (panel, (title, desc, xs, color)) in panels.iter().zip(series) {
            if xs.is_empty() {
                continue;
            }
            let mut chart = chart(panel, title, 0.0..(end_t * 1.05).max(1e-3), span(xs))?;
            chart
                .configure_mesh()
                .x_desc("run clock (s)")
                .y_desc(desc)
                .y_label_formatter(&|y| format!("{y:.0}"))
                .label_style((FONT, 13))
                .light_line_style(BLACK.mix(0.04))
                .bold_line_style(BLACK.mix(0.15))
                .draw()
                .map_err(|e| e.to_string())?;
            chart
                .draw_series(
                    xs.iter()
                        .map(|&p| Circle::new(p, 2, color.mix(0.7).filled())),
                )
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }))
}

/// Where each second went: one lane for the builds and one per GPU, each span coloured by what held
/// it (`report::timeline`); `None` without a span.
pub fn timeline(
    spans: &[crate::report::timeline::Span],
    wall: f64,
) -> Option<Result<String, String>> {
    use crate::report::timeline::{Lane, SpanKind};
    if spans.is_empty() {
        return None;
    }
    let mut lanes: Vec<Lane> = spans.iter().map(|s| s.lane.clone()).collect();
    lanes.sort();
    lanes.dedup();
    let color = |k: SpanKind| match k {
        SpanKind::Build => RGBColor(127, 127, 127),
        SpanKind::Worker => RGBColor(31, 119, 180),
        SpanKind::Roofs => RGBColor(255, 127, 14),
        SpanKind::Duels => RGBColor(214, 39, 40),
        SpanKind::Profiles => RGBColor(148, 103, 189),
        SpanKind::Reference => RGBColor(44, 160, 44),
    };
    let end = spans.iter().map(|s| s.end).fold(wall, f64::max).max(1e-3);
    let n = lanes.len();
    Some(svg(|root| {
        let mut chart = chart(
            root,
            "Timeline: what held each GPU, and the builds",
            0.0..end * 1.02,
            0.0..n as f64,
        )?;
        let names: Vec<String> = lanes
            .iter()
            .map(|l| match l {
                Lane::Builds => "builds".to_owned(),
                Lane::Gpu(d) => format!("GPU {d}"),
            })
            .collect();
        chart
            .configure_mesh()
            .x_desc("run clock (s)")
            .y_labels(n * 2 + 1)
            .y_label_formatter(&|y| {
                let i = (*y - 0.5).round();
                if (y - 0.5 - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < names.len() {
                    names[n - 1 - i as usize].clone()
                } else {
                    String::new()
                }
            })
            .disable_y_mesh()
            .label_style((FONT, 13))
            .light_line_style(BLACK.mix(0.04))
            .bold_line_style(BLACK.mix(0.15))
            .draw()
            .map_err(|e| e.to_string())?;
        let mut kinds: Vec<SpanKind> = spans.iter().map(|s| s.kind).collect();
        kinds.sort();
        kinds.dedup();
        for kind in kinds {
            let c = color(kind);
            let bars = spans.iter().filter(|s| s.kind == kind).map(|s| {
                let row = (n - 1 - lanes.iter().position(|l| *l == s.lane).unwrap_or(0)) as f64;
                // Builds overlap (several nvcc at once): translucent, so their density shows.
                let fill = if kind == SpanKind::Build {
                    c.mix(0.25)
                } else {
                    c.mix(0.85)
                };
                Rectangle::new(
                    [
                        (s.start, row + 0.15),
                        (s.end.max(s.start + end * 1e-4), row + 0.85),
                    ],
                    fill.filled(),
                )
            });
            chart
                .draw_series(bars)
                .map_err(|e| e.to_string())?
                .label(kind.label())
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], c.filled()));
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight)
    }))
}
