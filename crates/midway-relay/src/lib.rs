//! midway-relay
