//! Layers 3 and 4, the record: the run log (sealed, versioned, torn tails recovered), the read model built from it, and the results store across runs.
pub mod runindex;
pub mod runlog;
pub mod store;
