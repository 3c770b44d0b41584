//! midway's man pages, written from the command line's own definition (clap_mangen), so they
//! say what `--help` says: `midway.1` for the program and `midway-SUBCOMMAND.1` for each
//! subcommand it shows, the way git's pages are laid out.

use std::path::{Path, PathBuf};

use anyhow::Context;

/// Writes the pages for `command` into `out`; returns their paths.
pub(crate) fn write_pages(command: clap::Command, out: &Path) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let command = command.disable_help_subcommand(true);
    let name = command.get_name().to_string();
    let mut pages = vec![write_page(command.clone(), &name, out)?];
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        let page_name = format!("{name}-{}", sub.get_name());
        // The page's name is its file's (what `whatis` and `man midway-proxy` find); its
        // synopsis names the whole command line, "midway proxy".
        let sub = sub
            .clone()
            .display_name(page_name.clone())
            .bin_name(format!("{name} {}", sub.get_name()));
        pages.push(write_page(sub, &page_name, out)?);
    }
    Ok(pages)
}

fn write_page(command: clap::Command, file_stem: &str, out: &Path) -> anyhow::Result<PathBuf> {
    let path = out.join(format!("{file_stem}.1"));
    let mut roff = Vec::new();
    clap_mangen::Man::new(command)
        .render(&mut roff)
        .with_context(|| format!("cannot render {file_stem}.1"))?;
    std::fs::write(&path, roff).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}
