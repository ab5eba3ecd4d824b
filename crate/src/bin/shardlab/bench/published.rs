//! `shardlab bench published [--table FILE] [--json]`: the published training runs of
//! docs/published_runs.md (or FILE), each priced by the cost model beside its published step
//! time, and the mean absolute percentage error. Nothing runs here: it is the model's check
//! against runs on real hardware.
use shardlab::bench::published::{parse_table, price_runs, Pricing, TABLE, TABLE_PATH, TRACE_LIMIT};

#[derive(clap::Args)]
pub struct Args {
    /// A table of runs in docs/published_runs.md's form, instead of the shipped one.
    #[arg(long, value_name = "FILE")]
    pub table: Option<String>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// The most bytes `--table` reads: far more than a table of runs takes.
const MAX_TABLE_BYTES: u64 = 1 << 20;

pub fn run(args: Args) -> Result<(), String> {
    let (text, file) = match &args.table {
        Some(path) => (
            shardlab::model::read_text_file(shardlab::setting::Setting::Table, path, MAX_TABLE_BYTES)
                .map_err(|e| e.to_string())?,
            path.clone(),
        ),
        None => (TABLE.to_string(), TABLE_PATH.to_string()),
    };
    let runs = parse_table(&text, &file).map_err(|e| e.to_string())?;
    let report = price_runs(&runs, &file).map_err(|e| e.to_string())?;
    if args.json {
        println!("{}", serde_json::to_string(&report).map_err(|e| e.to_string())?);
        return Ok(());
    }
    // Columns as wide as their longest entry, so that every row lines up.
    let hardware: Vec<String> = report
        .checks
        .iter()
        .map(|c| format!("{} x {}", c.devices, c.device))
        .collect();
    let run_w = report.checks.iter().map(|c| c.name.len()).chain([3]).max().unwrap_or(3);
    let hw_w = hardware.iter().map(String::len).chain([8]).max().unwrap_or(8);
    println!(
        "{:<run_w$} {:<hw_w$} {:>13} {:>13} {:>8}  {:<11} fits (GiB/device)",
        "run", "hardware", "published ms", "predicted ms", "error", "priced"
    );
    for (c, hardware) in report.checks.iter().zip(&hardware) {
        println!(
            "{:<run_w$} {:<hw_w$} {:>13.1} {:>13.1} {:>+7.1}%  {:<11} {} ({:.1})",
            c.name,
            hardware,
            c.published_ms,
            c.predicted_ms,
            c.error_pct,
            match c.pricing {
                Pricing::Traced => "traced",
                Pricing::ClosedForm => "closed form",
            },
            if c.fits { "yes" } else { "no" },
            c.bytes_per_device as f64 / (1u64 << 30) as f64
        );
    }
    println!(
        "{} published runs: mean absolute percentage error {:.1}% (goal <= 20%); device figures fitted to rows: {}",
        report.checks.len(),
        report.mape_pct,
        if report.fitted.is_empty() {
            "none (datasheets and published measurements, profile/device.rs)".to_string()
        } else {
            report.fitted.join(", ")
        }
    );
    println!(
        "(closed form: a program of more than {TRACE_LIMIT} block passes, too many to trace, priced by the closed-form \
         estimate and memory)"
    );
    for c in &report.checks {
        println!(
            "\nrow {} {}:\n  source: {}\n  priced: {}",
            c.row, c.name, c.source, c.command
        );
        for a in &c.assumed {
            println!("  assumes: {a}");
        }
    }
    Ok(())
}
