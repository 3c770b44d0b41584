//! midway-labnet
