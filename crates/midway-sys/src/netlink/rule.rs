//! Policy rules that select a routing table by firewall mark (`ip rule add fwmark M lookup T`).

use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleMessage};
use netlink_packet_route::RouteNetlinkMessage;

use super::{Family, Netlink, NetlinkError};

/// `fwmark MARK[/MASK] lookup TABLE [priority P]`; rules listed by [`Netlink::rules`] that
/// match on something else have `fwmark: None`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FwmarkRule {
    /// Address family.
    pub family: Family,
    /// The mark packets must carry (under the mask).
    pub fwmark: Option<u32>,
    /// The mask; `None` means all bits (the kernel's default for a non-zero mark).
    pub mask: Option<u32>,
    /// The routing table to look up.
    pub table: u32,
    /// Priority (lower first); `None` when adding lets the kernel pick one just before the
    /// first existing rule after priority 0 (as `ip rule add` does).
    pub priority: Option<u32>,
}

impl FwmarkRule {
    /// `fwmark MARK lookup TABLE` for `family`, any priority.
    pub fn new(family: Family, fwmark: u32, table: u32) -> FwmarkRule {
        FwmarkRule {
            family,
            fwmark: Some(fwmark),
            mask: None,
            table,
            priority: None,
        }
    }

    pub(crate) fn message(&self) -> RuleMessage {
        let mut message = RuleMessage::default();
        message.header.family = self.family.netlink();
        message.header.table = u8::try_from(self.table).unwrap_or(0);
        message.header.action = RuleAction::ToTable;
        let attributes = &mut message.attributes;
        attributes.push(RuleAttribute::Table(self.table));
        if let Some(mark) = self.fwmark {
            attributes.push(RuleAttribute::FwMark(mark));
        }
        if let Some(mask) = self.mask {
            attributes.push(RuleAttribute::FwMask(mask));
        }
        if let Some(priority) = self.priority {
            attributes.push(RuleAttribute::Priority(priority));
        }
        message
    }

    pub(crate) fn from_message(message: &RuleMessage) -> Option<FwmarkRule> {
        let family = match message.header.family {
            netlink_packet_route::AddressFamily::Inet => Family::V4,
            netlink_packet_route::AddressFamily::Inet6 => Family::V6,
            _ => return None,
        };
        let mut rule = FwmarkRule {
            family,
            fwmark: None,
            mask: None,
            table: u32::from(message.header.table),
            // The kernel leaves out FRA_PRIORITY for priority 0.
            priority: Some(0),
        };
        for attribute in &message.attributes {
            match attribute {
                RuleAttribute::Table(t) => rule.table = *t,
                RuleAttribute::FwMark(m) => rule.fwmark = Some(*m),
                RuleAttribute::FwMask(m) => rule.mask = Some(*m),
                RuleAttribute::Priority(p) => rule.priority = Some(*p),
                _ => {}
            }
        }
        Some(rule)
    }

    fn describe(&self, verb: &str) -> String {
        // Every field as given (an all-bits mask too), unlike `Display`'s `ip rule show` form:
        // this names the exact request in an error.
        let mut text = format!("rule {verb} ({:?})", self.family);
        if let Some(mark) = self.fwmark {
            text.push_str(&format!(" fwmark {mark:#x}"));
            if let Some(mask) = self.mask {
                text.push_str(&format!("/{mask:#x}"));
            }
        }
        text.push_str(&format!(" lookup {}", self.table));
        if let Some(priority) = self.priority {
            text.push_str(&format!(" priority {priority}"));
        }
        text
    }
}

/// In `ip rule show`'s words, without the priority: `fwmark 0x1 lookup 100`, the mask shown
/// only when it is not all bits (`fwmark 0x100/0xff00 lookup 100`).
impl std::fmt::Display for FwmarkRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(mark) = self.fwmark {
            write!(f, "fwmark {mark:#x}")?;
            match self.mask {
                Some(mask) if mask != u32::MAX => write!(f, "/{mask:#x} ")?,
                _ => f.write_str(" ")?,
            }
        }
        write!(f, "lookup {}", self.table)
    }
}

impl Netlink {
    /// `ip rule add`: fails with `EEXIST` if the same rule exists.
    pub fn add_rule(&mut self, rule: &FwmarkRule) -> Result<(), NetlinkError> {
        self.request(
            RouteNetlinkMessage::NewRule(rule.message()),
            NLM_F_CREATE | NLM_F_EXCL,
            &rule.describe("add"),
        )
    }

    /// `ip rule del`: removes the first rule that matches what is given (family, table,
    /// mark, mask, priority); `ENOENT` if none.
    pub fn delete_rule(&mut self, rule: &FwmarkRule) -> Result<(), NetlinkError> {
        self.request(
            RouteNetlinkMessage::DelRule(rule.message()),
            0,
            &rule.describe("del"),
        )
    }

    /// `ip rule show` for `family`: every rule, with the table it looks up and its mark (if
    /// it matches on one).
    pub fn rules(&mut self, family: Family) -> Result<Vec<FwmarkRule>, NetlinkError> {
        let mut query = RuleMessage::default();
        query.header.family = family.netlink();
        let messages = self.dump(
            RouteNetlinkMessage::GetRule(query),
            &format!("rule show ({family:?})"),
        )?;
        Ok(messages
            .iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewRule(rule) => FwmarkRule::from_message(rule),
                _ => None,
            })
            .filter(|r| r.family == family)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rule_survives_the_trip_through_its_message() {
        let rule = FwmarkRule {
            mask: Some(u32::MAX),
            priority: Some(1000),
            ..FwmarkRule::new(Family::V6, 0x4d00, 300)
        };
        let message = rule.message();
        assert_eq!(message.header.table, 0);
        assert_eq!(FwmarkRule::from_message(&message), Some(rule.clone()));
        assert_eq!(
            rule.describe("add"),
            "rule add (V6) fwmark 0x4d00/0xffffffff lookup 300 priority 1000"
        );
        let small = FwmarkRule::new(Family::V4, 1, 100).message();
        assert_eq!(small.header.table, 100);
    }
}
