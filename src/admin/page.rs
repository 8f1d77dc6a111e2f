//! The HTML status page (`/`): the first screen answers what is wrong, since when, what
//! staleguard does and what clients get (`screen`), with the plots of the incident below it
//! (`plots`); then the details: the banners and events (`incident`), the namespaces and the
//! dry run (`tables`), the write-stall watch, the fleet, upstreams and config (`sections`).
//! Refreshed every 2 s by a tiny inline script (no external assets); it fits a 1280 px and a
//! 390 px wide screen without scrolling sideways (tables turn into cards when narrow). Every
//! value that can come from outside (namespaces come from clients) is escaped.

use std::fmt::Write as _;
use std::time::Duration;

use super::plots::Window;
use super::status::Status;
use super::text::{esc, rfc3339, short_duration};

/// What the reader asked for in the URL.
#[derive(Debug, Default)]
pub struct Asked {
    /// `?window=`: the plots' window (none: the incident when there is one).
    pub window: Option<Window>,
    /// Added to the page's own links: `&token=...` when the page was opened with one.
    pub keep: String,
}

impl Asked {
    /// From the query string of the page's URL.
    pub fn from_query(query: Option<&str>) -> Asked {
        let mut asked = Asked::default();
        for (k, v) in query
            .unwrap_or("")
            .split('&')
            .filter_map(|kv| kv.split_once('='))
        {
            match k {
                "window" => asked.window = Window::parse(v),
                // Kept as it came (still percent-encoded), to be sent back as it came.
                "token" => asked.keep = format!("&token={v}"),
                _ => {}
            }
        }
        asked
    }
}

const STYLE: &str = r#"
*{box-sizing:border-box}
body{font:15px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1d1d1f;background:#f6f6f4}
header{background:#20242b;color:#fff;padding:8px 16px}
header h1{display:inline;font-size:18px;margin:0 10px 0 0}
header span{color:#c9ccd1;font-size:13px}
main{padding:6px 16px 20px;max-width:100%}
h2{font-size:16px;margin:18px 0 6px}
code{font-size:13px;overflow-wrap:anywhere}
td,th,li,p,div{overflow-wrap:break-word}
table{border-collapse:collapse;width:100%;background:#fff}
th,td{text-align:left;padding:5px 8px;border-bottom:1px solid #e2e2df;vertical-align:top}
th{background:#ecece8;font-weight:600}
tr.open td{background:#fde2e1}
#namespaces td:first-child,#right-now td:first-child{min-width:11em}
tr.open td.state b,tr.raised td.state b{color:#b3001b;text-transform:uppercase}
tr.raised td{background:#fde2e1}
.summary{display:grid;grid-template-columns:minmax(0,1.1fr) minmax(0,1fr);gap:14px;margin:10px 0;padding:12px 14px;border-radius:6px;background:#fff;border-left:8px solid #17582a}
.summary.incident{border-left-color:#b3001b}
.summary.degraded{border-left-color:#d4a000}
.headline{font-size:21px;font-weight:700;margin:0 0 4px}
.summary.incident .headline{color:#b3001b}
.since{margin:0 0 6px;font-weight:600}
.summary ul{margin:4px 0 6px;padding-left:20px}
.doing-title,.now-title{margin:8px 0 2px;font-weight:600}
.now table td:not(:first-child),.now table th:not(:first-child){text-align:right}
.banner{padding:8px 12px;margin:8px 0;border-radius:4px;font-weight:600}
.banner.bad{background:#b3001b;color:#fff}
.banner.warn{background:#ffe8a3}
.banner.good{background:#dff3e3;color:#17582a}
.banner .why{font-weight:normal}
.down{color:#b3001b;font-weight:700}
.banner .down{color:inherit}
.up{color:#17582a;font-weight:600}
.muted{color:#6b6b6b;font-weight:normal}
.banner .muted{color:inherit}
tr.bad td:nth-child(2){color:#b3001b;font-weight:600}
nav.windows a{margin-right:8px}
nav.windows a.on{font-weight:700;color:#1d1d1f;text-decoration:none}
.legend{margin:4px 0}
.legend span{margin-right:12px;font-size:13px;white-space:nowrap}
.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-1px}
.plots{display:grid;grid-template-columns:repeat(auto-fill,minmax(min(100%,520px),1fr));gap:10px}
figure.plot{margin:0;background:#fff;padding:6px 8px 2px}
figure.plot figcaption{font-size:13px}
.chart{position:relative;padding-left:34px}
.chart svg{display:block;width:100%;height:120px}
.chart .ymax,.chart .y0{position:absolute;left:0;width:30px;text-align:right;font-size:11px;color:#555}
.chart .ymax{top:0}
.chart .y0{top:108px}
.xaxis{position:relative;height:18px;font-size:11px;color:#555}
.xaxis span{position:absolute;top:2px;transform:translateX(-50%);white-space:nowrap}
.xaxis span.r{transform:translateX(-100%)}
.xaxis span.l{transform:none}
footer{color:#6b6b6b;font-size:13px;margin-top:18px}
@media (max-width:900px){.summary{grid-template-columns:minmax(0,1fr)}}
@media (max-width:700px){
 main{padding:4px 8px 16px}
 header span{display:block}
 .headline{font-size:18px}
 table.cards,table.cards tbody,table.cards tr,table.cards td{display:block;width:auto}
 table.cards tr.head{display:none}
 table.cards tr{border:1px solid #e2e2df;margin:6px 0;background:#fff}
 table.cards td{border:none;padding:2px 8px}
 table.cards td[data-label]::before{content:attr(data-label) ": ";font-weight:600;color:#555}
 .now table td:not(:first-child){text-align:left}
 .xaxis span:nth-child(even){display:none}
}
"#;

const SCRIPT: &str = r#"
(function(){
  function tick(){
    fetch(location.href,{cache:"no-store"}).then(function(r){
      if(!r.ok){throw new Error("HTTP "+r.status);}
      return r.text();
    }).then(function(t){
      var m=new DOMParser().parseFromString(t,"text/html").getElementById("main");
      if(m){document.getElementById("main").replaceWith(m);}
      document.getElementById("conn").hidden=true;
    }).catch(function(e){
      var c=document.getElementById("conn");
      c.textContent="Cannot reach the staleguard admin endpoint ("+e.message+"); the figures below are stale.";
      c.hidden=false;
    });
  }
  setInterval(tick,2000);
})();
"#;

/// The whole page.
pub fn render(s: &Status, asked: &Asked) -> String {
    let mut out = String::with_capacity(32 * 1024);
    out.push_str("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">");
    out.push_str("<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">");
    out.push_str("<title>staleguard status</title>");
    out.push_str("<noscript><meta http-equiv=\"refresh\" content=\"2\"></noscript>");
    let _ = write!(out, "<style>{STYLE}</style></head><body>");
    out.push_str("<div id=\"conn\" class=\"banner bad\" hidden></div>");
    out.push_str("<div id=\"main\">");
    header(&mut out, s);
    out.push_str("<main>");
    super::screen::render(&mut out, &s.summary);
    super::plots::section(&mut out, &s.history, asked.window, &asked.keep);
    out.push_str("<h2 id=\"details\">Details</h2>");
    super::incident::banners(&mut out, s);
    super::tables::namespaces(&mut out, &s.namespaces);
    super::tables::dry_run(&mut out, &s.namespaces);
    super::incident::events(&mut out, &s.events, s.events_recorded_total);
    super::sections::write_stall(&mut out, &s.write_stall);
    super::sections::fleet(&mut out, s.fleet.as_ref());
    super::sections::upstreams(&mut out, s);
    super::sections::config(&mut out, s);
    let _ = write!(
        out,
        "<footer>Page built {} (UTC) &middot; refreshes every 2 s &middot; \
         <a href=\"status\">status JSON</a> &middot; <a href=\"metrics\">metrics</a></footer>",
        esc(&rfc3339(std::time::SystemTime::now()))
    );
    out.push_str("</main></div>");
    let _ = writeln!(out, "<script>{SCRIPT}</script></body></html>");
    out
}

fn header(out: &mut String, s: &Status) {
    let tls = if s.tls { " (TLS)" } else { "" };
    let _ = write!(
        out,
        "<header><h1>staleguard</h1><span>v{} &middot; up {} &middot; clients connect to {}{} \
         &middot; {} client connection{}</span></header>",
        esc(s.version),
        short_duration(Duration::from_secs(s.uptime_seconds)),
        esc(&s.listen),
        tls,
        s.client_connections,
        if s.client_connections == 1 { "" } else { "s" },
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_picks_the_window_and_keeps_the_token() {
        let a = Asked::from_query(Some("token=a%20b&window=3h"));
        assert_eq!(a.window, Some(Window::Hours3));
        assert_eq!(a.keep, "&token=a%20b");
        let a = Asked::from_query(Some("window=<script>"));
        assert_eq!(a.window, None);
        assert_eq!(a.keep, "");
        assert_eq!(Asked::from_query(None).window, None);
    }
}
