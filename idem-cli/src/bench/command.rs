//! `idem bench`: the command, from its arguments to the reports printed, saved and drawn.

use idemkit::StoreUrl;

use super::{BenchOptions, BenchReport, SaturationOptions, SaturationReport};
use crate::cli::BenchArgs;
use crate::exit::Failure;

/// `idem bench` on `store`.
pub(crate) async fn run(store: StoreUrl, args: BenchArgs) -> Result<(), Failure> {
    let BenchArgs {
        operations,
        concurrency,
        records,
        duration,
        purge,
        purge_batch,
        purge_duty,
        saturation,
        replay_cache,
        json,
        save,
        plot,
        plot_with,
        plot_only,
    } = args;
    let values_with = || -> Result<Vec<serde_json::Value>, Failure> {
        plot_with
            .iter()
            .map(|path| {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| Failure::usage(format!("{}: {e}", path.display())))?;
                serde_json::from_str(&text)
                    .map_err(|e| Failure::usage(format!("{}: {e}", path.display())))
            })
            .collect()
    };
    let reports_with = || -> Result<Vec<BenchReport>, Failure> {
        let values = values_with()?;
        let reports = values.iter().map(BenchReport::from_json);
        reports.collect::<Result<_, _>>().map_err(Failure::usage)
    };
    let saturations_with = || -> Result<Vec<SaturationReport>, Failure> {
        let values = values_with()?;
        let reports = values.iter().map(SaturationReport::from_json);
        reports.collect::<Result<_, _>>().map_err(Failure::usage)
    };
    // A report measured: to `--save`'s file, then printed as JSON or as text.
    let emit = |value: serde_json::Value, text: String| -> Result<(), Failure> {
        if let Some(path) = &save {
            std::fs::write(path, format!("{value}\n"))
                .map_err(|e| Failure::other(format!("{}: {e}", path.display())))?;
        }
        if json {
            println!("{value}");
        } else {
            print!("{text}");
        }
        Ok(())
    };
    // Reports of `--saturation` (they have levels, not points) draw its plot.
    let saturation_plot = !saturation.is_empty()
        || (plot_only
            && !plot_with.is_empty()
            && values_with()?.iter().all(|v| v["levels"].is_array()));
    if saturation_plot {
        let mut reports = saturations_with()?;
        if !plot_only {
            let opts = SaturationOptions {
                callers: saturation,
                operations,
                replay_cache,
            };
            let report = super::saturation(&store, &opts)
                .await
                .map_err(|e| e.context(format!("bench on {store}")))?;
            emit(
                report.to_json(),
                format!("idem bench --saturation on {store}\n{report}"),
            )?;
            reports.push(report);
        }
        if let Some(plot) = &plot {
            super::plot_saturation(plot, &reports).map_err(Failure::other)?;
        }
        return Ok(());
    }
    if let (true, Some(plot)) = (plot_only, &plot) {
        return super::plot(plot, &reports_with()?).map_err(Failure::other);
    }
    let opts = BenchOptions {
        operations,
        concurrency,
        records,
        duration,
        purge,
        purge_batch,
        purge_duty,
        replay_cache,
    };
    let report = super::bench(&store, &opts)
        .await
        .map_err(|e| e.context(format!("bench on {store}")))?;
    emit(report.to_json(), format!("idem bench on {store}\n{report}"))?;
    if let Some(plot) = plot {
        let mut reports = reports_with()?;
        reports.push(report);
        super::plot(&plot, &reports).map_err(Failure::other)?;
    }
    Ok(())
}
