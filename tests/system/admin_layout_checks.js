// Run by tests/system/test_admin_layout.py in the page: every problem on it, one line each.
// opts.narrow (a phone's width): a wide table may scroll inside its own box, as Django's
// admin lays it out there; the page itself may not, and no text may break inside a word.
(opts) => {
  const narrow = Boolean(opts && opts.narrow);
  const problems = [];
  const root = document.documentElement;
  if (root.scrollWidth > root.clientWidth + 1)
    problems.push(`page overflows: scrollWidth ${root.scrollWidth} > ${root.clientWidth}`);
  const content = document.querySelector('#content');
  const name = (e) => e.id ? '#' + e.id : e.tagName.toLowerCase() +
    (e.className && typeof e.className === 'string' ? '.' + e.className.trim().split(/\s+/).join('.') : '');
  if (content && content.scrollWidth > content.clientWidth + 1)
    problems.push(`#content overflows: ${content.scrollWidth} > ${content.clientWidth}`);
  for (const e of (content && !narrow ? content.querySelectorAll('*') : [])) {
    if (e.closest('.visually-hidden')) continue;  // clipped to 1 px on purpose
    const ox = getComputedStyle(e).overflowX;
    if (['auto', 'scroll', 'hidden'].includes(ox) && e.clientWidth > 0 &&
        e.scrollWidth > e.clientWidth + 1 && e.tagName !== 'SELECT' && e.tagName !== 'PRE' &&
        e.tagName !== 'TEXTAREA')
      problems.push(`${name(e)} scrolls sideways: ${e.scrollWidth} > ${e.clientWidth}`);
  }
  // a header cell must not break inside a word: no more lines than words
  for (const th of document.querySelectorAll('#content th')) {
    if (th.closest('.visually-hidden')) continue;
    for (const node of th.childNodes) {
      if (node.nodeType !== Node.TEXT_NODE && !(node.tagName === 'A' || node.tagName === 'SPAN'))
        continue;
      const text = node.textContent.trim();
      if (!text) continue;
      const range = document.createRange();
      range.selectNodeContents(node);
      const tops = new Set([...range.getClientRects()].filter(r => r.width > 0).map(r => Math.round(r.top)));
      // break opportunities: spaces, and the dots and underscores of a dotted path
      const words = text.split(/\s+|(?<=[._])/).filter(Boolean).length;
      if (tops.size > words)
        problems.push(`header "${text}" wraps inside a word (${tops.size} lines, ${words} words)`);
    }
  }
  // no link, caption or cell text breaks inside a word (a name wrapping letter by letter
  // in a squeezed column): no more lines than break opportunities allow
  for (const e of document.querySelectorAll('#content a, #content caption, #content td, #nav-sidebar a, #content h1, #content h2')) {
    if (e.closest('.visually-hidden') || e.getClientRects().length === 0) continue;
    for (const node of e.childNodes) {
      if (node.nodeType !== Node.TEXT_NODE) continue;
      const text = node.textContent.trim();
      if (!text) continue;
      const range = document.createRange();
      range.selectNodeContents(node);
      const tops = new Set([...range.getClientRects()].filter(r => r.width > 0).map(r => Math.round(r.top)));
      const words = text.split(/\s+|(?<=[._\-:/])/).filter(Boolean).length;
      if (tops.size > words)
        problems.push(`"${text.slice(0, 40)}" in ${name(e)} breaks inside a word (${tops.size} lines, ${words} words)`);
    }
  }
  // contrast
  const parse = (c) => {
    const m = c.match(/rgba?\(([^)]+)\)/);
    if (!m) return null;
    const p = m[1].split(/[\s,\/]+/).filter(Boolean).map(Number);
    return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
  };
  const over = (top, bottom) => [0, 1, 2].map(i => top[i] * top[3] + bottom[i] * (1 - top[3]));
  const backgroundOf = (e) => {
    const layers = [];
    for (let n = e; n; n = n.parentElement) {
      const bg = parse(getComputedStyle(n).backgroundColor);
      if (bg && bg[3] > 0) { layers.push(bg); if (bg[3] >= 1) break; }
    }
    let colour = [255, 255, 255];
    for (const layer of layers.reverse()) colour = over(layer, colour);
    return colour;
  };
  const lum = (c) => {
    const [r, g, b] = c.map(v => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  const ratio = (a, b) => { const [x, y] = [lum(a), lum(b)].sort((p, q) => q - p); return (x + 0.05) / (y + 0.05); };
  // a colour key (a swatch standing for a chart's series) stands out from where it is drawn:
  // WCAG's 3:1 for graphics
  for (const key of document.querySelectorAll('#content .tc-key')) {
    const own = parse(getComputedStyle(key).backgroundColor);
    if (!own || own[3] === 0) continue;
    const behind = backgroundOf(key.parentElement);
    const value = ratio(over(own, behind), behind);
    if (value < 3)
      problems.push(`colour key ${name(key)} contrast ${value.toFixed(2)} < 3 on rgb(${behind.map(Math.round)})`);
  }
  const checked = [];
  const scope = document.querySelectorAll('#content *, #header a, .breadcrumbs, .breadcrumbs a');
  for (const e of scope) {
    if (['SCRIPT', 'STYLE', 'OPTION', 'SELECT', 'INPUT', 'TEXTAREA'].includes(e.tagName)) continue;
    const own = [...e.childNodes].filter(n => n.nodeType === Node.TEXT_NODE && n.textContent.trim());
    if (!own.length) continue;
    const style = getComputedStyle(e);
    if (style.visibility !== 'visible' || e.getClientRects().length === 0) continue;
    const fg = parse(style.color);
    if (!fg) continue;
    const bg = backgroundOf(e);
    const value = ratio(over(fg, bg), bg);
    const size = parseFloat(style.fontSize);
    const large = size >= 24 || (size >= 18.66 && parseInt(style.fontWeight) >= 700);
    const need = large ? 3 : 4.5;
    const text = own.map(n => n.textContent.trim()).join(' ').slice(0, 40);
    checked.push(e.tagName);
    if (value < need)
      problems.push(`contrast ${value.toFixed(2)} < ${need} for ${name(e)} "${text}" (${style.color} on rgb(${bg.map(Math.round)}))`);
  }
  return {problems, checked: checked.length,
          links: checked.filter(t => t === 'A').length,
          headers: checked.filter(t => /^(TH|H1|H2|H3|CAPTION)$/.test(t)).length};
}
