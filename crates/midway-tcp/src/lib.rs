//! midway-tcp
