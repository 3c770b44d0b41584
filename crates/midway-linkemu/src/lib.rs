//! midway-linkemu
