// Gavel console: follow the server's event stream (server-sent events) and re-render the
// parts of this page that an event touched. No polling: nothing happens without an event.
(function () {
  'use strict';
  var body = document.body;
  var topics = (body.dataset.topics || '').split(' ').filter(Boolean);
  var live = document.getElementById('live');
  var busy = false, again = false, opened = false;

  function editing() {
    var a = document.activeElement;
    return a && a.closest && a.closest('#main') && (a.tagName === 'INPUT' || a.tagName === 'SELECT');
  }

  // refresh fetches this page's main part and swaps it in; events during a fetch coalesce
  // into one more fetch, and a field being edited is not replaced until it loses focus.
  function refresh() {
    if (busy) { again = true; return; }
    if (editing()) {
      again = true;
      document.activeElement.addEventListener('blur', function () { if (again) { again = false; refresh(); } }, { once: true });
      return;
    }
    busy = true;
    fetch(location.href, { headers: { 'X-Console-Fragment': '1' } })
      .then(function (r) { return r.text(); })
      .then(function (html) { document.getElementById('main').innerHTML = html; })
      .catch(function () {})
      .finally(function () { busy = false; if (again) { again = false; refresh(); } });
  }

  function addLines(lines) {
    var list = document.getElementById('lines');
    if (!list) { return; }
    lines.forEach(function (l) {
      var li = document.createElement('li');
      var t = document.createElement('time');
      t.textContent = new Date(l.time).toTimeString().slice(0, 8);
      var rev = document.createElement('span');
      rev.className = 'rev';
      rev.textContent = '#' + l.revision;
      var kind = document.createElement('span');
      kind.className = 'kind';
      kind.textContent = l.kind;
      li.append(t, ' ', rev, ' ', kind, ' ' + l.text);
      list.insertBefore(li, list.firstChild);
    });
  }

  var es = new EventSource('/stream');
  es.onopen = function () {
    body.dataset.live = '1';
    live.textContent = 'live';
    if (opened && topics.length) { refresh(); } // catch up after a reconnect
    opened = true;
  };
  es.onerror = function () {
    body.dataset.live = '0';
    live.textContent = 'reconnecting…';
  };
  // Close the stream when the page goes: a browser keeps few connections per server.
  window.addEventListener('pagehide', function () { es.close(); });
  es.onmessage = function (m) {
    var u = JSON.parse(m.data);
    if (body.dataset.page === 'events' && u.lines) { addLines(u.lines); }
    if ((u.topics || []).some(function (t) { return topics.indexOf(t) >= 0; })) { refresh(); }
  };
})();
