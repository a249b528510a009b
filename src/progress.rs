//! The one progress bar of `ft`: elapsed time, the bar, done of total in the work's unit,
//! the rate and the estimated time left, on stderr (indicatif hides it when stderr is not
//! a terminal, so logs and redirected output carry no bar).

/// The template of every bar: `{unit}` is replaced by the work's unit.
const TEMPLATE: &str =
    "{elapsed_precise} [{bar:40}] {pos}/{len} {unit} ({per_sec}, eta {eta}) {msg}";

/// A progress bar over `len` items of `unit` (`steps`, `points`, `runs`).
pub fn bar(len: u64, unit: &str) -> indicatif::ProgressBar {
    let style = indicatif::ProgressStyle::with_template(&TEMPLATE.replace("{unit}", unit))
        .expect("the progress template is valid")
        .progress_chars("=> ");
    indicatif::ProgressBar::new(len).with_style(style)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_bar_has_an_eta_and_the_unit() {
        let b = super::bar(10, "steps");
        b.set_position(4);
        assert_eq!(b.length(), Some(10));
        assert!(super::TEMPLATE.contains("{eta}"));
        assert!(super::TEMPLATE
            .replace("{unit}", "steps")
            .contains("{len} steps"));
    }
}
