//! One measurement row as the store holds it, and its seal: a keyed hash over every column (see
//! `seal`), so a row edited in the file (a figure, a build key, the log line it cites) or written
//! into it by hand no longer holds and is never read.
use crate::os::seal::SealKey;

/// The measurement columns in the order they are selected and sealed (the seal column comes after).
pub(super) const COLUMNS: &str = "run_id, log_line, gpu, driver, nvcc, fake, build_key, reference_key, \
     variant, params, shape, geometry, dtype, kv_splits, median_us, p10_us, p90_us, tflops, timing, \
     origin_run, origin_line";

/// A measurement row, every column.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub run_id: String,
    pub log_line: usize,
    pub gpu: String,
    pub driver: i32,
    pub nvcc: String,
    pub fake: bool,
    pub build_key: String,
    pub reference_key: String,
    pub variant: String,
    /// The variant's parameters, as JSON.
    pub params: String,
    pub shape: String,
    pub geometry: String,
    pub dtype: String,
    pub kv_splits: u32,
    pub median_us: f64,
    pub p10_us: f64,
    pub p90_us: f64,
    pub tflops: f64,
    /// The whole timing, as JSON.
    pub timing: String,
    pub origin_run: String,
    pub origin_line: usize,
}

impl Row {
    /// The row and its seal (none in a row from before rows were sealed), from a `SELECT COLUMNS, seal`.
    pub(super) fn read(r: &rusqlite::Row) -> rusqlite::Result<(Row, Option<String>)> {
        Ok((
            Row {
                run_id: r.get(0)?,
                log_line: r.get::<_, i64>(1)? as usize,
                gpu: r.get(2)?,
                driver: r.get(3)?,
                nvcc: r.get(4)?,
                fake: r.get(5)?,
                build_key: r.get(6)?,
                reference_key: r.get(7)?,
                variant: r.get(8)?,
                params: r.get(9)?,
                shape: r.get(10)?,
                geometry: r.get(11)?,
                dtype: r.get(12)?,
                kv_splits: r.get(13)?,
                median_us: r.get(14)?,
                p10_us: r.get(15)?,
                p90_us: r.get(16)?,
                tflops: r.get(17)?,
                timing: r.get(18)?,
                origin_run: r.get(19)?,
                origin_line: r.get::<_, i64>(20)? as usize,
            },
            r.get(21)?,
        ))
    }

    /// The columns as the seal covers them: text, floats in their shortest exact form.
    fn fields(&self) -> Vec<String> {
        vec![
            self.run_id.clone(),
            self.log_line.to_string(),
            self.gpu.clone(),
            self.driver.to_string(),
            self.nvcc.clone(),
            self.fake.to_string(),
            self.build_key.clone(),
            self.reference_key.clone(),
            self.variant.clone(),
            self.params.clone(),
            self.shape.clone(),
            self.geometry.clone(),
            self.dtype.clone(),
            self.kv_splits.to_string(),
            format!("{:?}", self.median_us),
            format!("{:?}", self.p10_us),
            format!("{:?}", self.p90_us),
            format!("{:?}", self.tflops),
            self.timing.clone(),
            self.origin_run.clone(),
            self.origin_line.to_string(),
        ]
    }

    pub(super) fn seal(&self, key: &SealKey) -> String {
        let fields = self.fields();
        key.row_seal(&fields.iter().map(String::as_str).collect::<Vec<_>>())
    }

    pub(super) fn seal_holds(&self, key: &SealKey, seal: Option<&str>) -> bool {
        let fields = self.fields();
        seal.is_some_and(|s| {
            key.row_seal_holds(&fields.iter().map(String::as_str).collect::<Vec<_>>(), s)
        })
    }
}
