//! Lab results: the record every lab run appends (one JSON line per measurement) and the report
//! built from a folder of such records (markdown tables, PNG and SVG plots).
//!
//! Experiments write data; plotting is a separate step, so a report can be rebuilt from the
//! JSON lines alone (`midway lab report DIR`).

pub mod record;

pub use record::RunRecord;
