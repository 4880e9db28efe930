//! The inline SVG bar chart of regions per pool topic: one horizontal bar per topic, its length proportional to
//! the topic's regions, the topic's name on the left and the count at the bar's end.

use std::fmt::Write;

use super::escape::escape;

/// Width of the whole chart, in SVG user units (pixels at scale 1).
const WIDTH: usize = 720;
/// Width kept for the topic names on the left.
const LABEL_WIDTH: usize = 260;
/// Width kept for the count after the longest bar.
const COUNT_WIDTH: usize = 60;
/// Height of one topic's row, and of its bar.
const ROW: usize = 22;
const BAR: usize = 16;

/// One bar: a topic and its regions; `outside_pool` marks a topic regions use that the configured pool lacks.
pub struct Bar<'a> {
    /// The topic.
    pub topic: &'a str,
    /// Regions writing to it.
    pub regions: usize,
    /// Not one of the configured pool's topics.
    pub outside_pool: bool,
}

/// The chart as an `<svg>` element with `id="topic-regions"`; each bar is a `<rect class="bar">` carrying
/// `data-topic` and `data-regions`, so a reader (or a test) finds a topic's bar without measuring it.
pub fn bar_chart(bars: &[Bar<'_>]) -> String {
    let max = bars.iter().map(|b| b.regions).max().unwrap_or(0).max(1);
    let span = WIDTH - LABEL_WIDTH - COUNT_WIDTH;
    let height = ROW * bars.len().max(1);
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg id="topic-regions" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" role="img" aria-label="regions per topic">"#
    );
    for (i, bar) in bars.iter().enumerate() {
        let y = i * ROW;
        let length = bar.regions * span / max;
        let class = if bar.outside_pool {
            "bar outside-pool"
        } else {
            "bar"
        };
        let topic = escape(bar.topic);
        let middle = y + ROW / 2;
        let _ = write!(
            svg,
            r#"<g class="topic"><title>{topic}: {regions} regions</title><text class="label" x="{lx}" y="{middle}" text-anchor="end" dominant-baseline="middle">{topic}</text><rect class="{class}" data-topic="{topic}" data-regions="{regions}" x="{LABEL_WIDTH}" y="{by}" width="{length}" height="{BAR}"/><text class="count" x="{cx}" y="{middle}" dominant-baseline="middle">{regions}</text></g>"#,
            regions = bar.regions,
            lx = LABEL_WIDTH - 8,
            by = y + (ROW - BAR) / 2,
            cx = LABEL_WIDTH + length + 6,
        );
    }
    svg.push_str("</svg>");
    svg
}

#[cfg(test)]
mod tests {
    use super::{Bar, bar_chart};

    #[test]
    fn one_bar_per_topic_with_lengths_proportional_to_regions() {
        let svg = bar_chart(&[
            Bar {
                topic: "wal_0",
                regions: 4,
                outside_pool: false,
            },
            Bar {
                topic: "wal_1",
                regions: 2,
                outside_pool: false,
            },
            Bar {
                topic: "old<&>",
                regions: 0,
                outside_pool: true,
            },
        ]);
        assert_eq!(svg.matches("<rect ").count(), 3, "{svg}");
        // The longest bar spans the whole bar area (720 - 260 - 60 = 400); the others in proportion.
        assert!(
            svg.contains(r#"data-topic="wal_0" data-regions="4" x="260" y="3" width="400""#),
            "{svg}"
        );
        assert!(
            svg.contains(r#"data-topic="wal_1" data-regions="2" x="260" y="25" width="200""#),
            "{svg}"
        );
        assert!(
            svg.contains(
                r#"class="bar outside-pool" data-topic="old&lt;&amp;&gt;" data-regions="0""#
            ),
            "{svg}"
        );
        assert!(!svg.contains("old<"), "{svg}");
    }

    #[test]
    fn a_pool_of_no_region_draws_empty_bars() {
        let svg = bar_chart(&[Bar {
            topic: "wal_0",
            regions: 0,
            outside_pool: false,
        }]);
        assert!(
            svg.contains(r#"data-regions="0" x="260" y="3" width="0""#),
            "{svg}"
        );
    }
}
