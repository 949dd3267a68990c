// The report page's charts: reads the JSON in #report-data and draws one uPlot chart into each
// chart placeholder the page has (a div of class chart, its data-chart attribute naming the
// chart). When done, the body's data-rendered attribute holds how many were drawn (tests/report/render_test.sh compares it with the placeholders and with the
// uplot elements in the DOM). Built into the library (cmake/EmbedFiles.cmake), inlined per page.
(function () {
  'use strict';
  var data = JSON.parse(document.getElementById('report-data').textContent);
  var metrics = data.metrics;
  var MiB = 1024 * 1024;
  var palette = ['#1f77b4', '#d62728', '#2ca02c', '#ff7f0e', '#9467bd', '#8c564b', '#e377c2',
                 '#7f7f7f', '#bcbd22', '#17becf'];

  function col(name) { return metrics.columns.indexOf(name); }
  function num(v) { return typeof v === 'number' && isFinite(v) ? v : null; }

  // Distinct steps, and per step the rows of each rank.
  var steps = [];
  var rowsByStep = [];
  metrics.rows.forEach(function (row) {
    if (steps.length === 0 || steps[steps.length - 1] !== row[0]) {
      steps.push(row[0]);
      rowsByStep.push([]);
    }
    rowsByStep[rowsByStep.length - 1].push(row);
  });
  var ranks = [];
  metrics.rows.forEach(function (row) { if (ranks.indexOf(row[1]) < 0) ranks.push(row[1]); });
  ranks.sort(function (a, b) { return a - b; });

  // A global value per step: the lowest rank's that has one (loss, lr, tokens/s are the same on
  // every rank; evaluation steps may have it on some ranks only).
  function global(name) {
    var c = col(name);
    return rowsByStep.map(function (rows) {
      if (c < 0) return null;
      for (var i = 0; i < rows.length; i++) if (num(rows[i][c]) !== null) return rows[i][c];
      return null;
    });
  }
  function ofRank(name, rank, scale) {
    var c = col(name);
    return rowsByStep.map(function (rows) {
      for (var i = 0; i < rows.length; i++) {
        if (rows[i][1] === rank) return c < 0 || num(rows[i][c]) === null ? null : rows[i][c] * scale;
      }
      return null;
    });
  }
  function meanOverRanks(name) {
    var c = col(name);
    return rowsByStep.map(function (rows) {
      var sum = 0, n = 0;
      rows.forEach(function (r) { if (c >= 0 && num(r[c]) !== null) { sum += r[c]; n++; } });
      return n ? sum / n : null;
    });
  }

  function line(label, color, extra) {
    var s = { label: label, stroke: color, width: 1.5 };
    for (var k in extra || {}) s[k] = extra[k];
    return s;
  }
  function axis(label, extra) {
    var a = { label: label };
    for (var k in extra || {}) a[k] = extra[k];
    return a;
  }
  // Whole steps between x ticks: 1, 2, 5, 10, 20, 50, ...
  var stepIncrements = [];
  for (var p = 1; p < 1e12; p *= 10) stepIncrements.push(p, 2 * p, 5 * p);
  // Tick labels that tell 0.0003 from 0.0001 (uPlot's default rounds both to 0).
  function tick(v) {
    if (v === null) return '';
    var a = Math.abs(v);
    if (a !== 0 && a < 0.01) return v.toExponential(1);
    return (+v.toPrecision(6)).toLocaleString('en-US');
  }
  function yAxis(label, extra) {
    var a = axis(label, extra);
    a.values = function (u, vals) { return vals.map(tick); };
    a.size = 60;
    return a;
  }
  function stepChart(title, yLabel, series, columns, more) {
    var opts = {
      title: title,
      height: 260,
      scales: { x: { time: false } },
      axes: [axis('step', { incrs: stepIncrements }), yAxis(yLabel)],
      series: [{ label: 'step' }].concat(series),
    };
    for (var k in more || {}) opts[k] = more[k];
    return { opts: opts, data: [steps].concat(columns) };
  }

  var builders = {
    loss: function () {
      var evalLoss = global('eval_loss');
      var series = [line('loss', palette[0])];
      var columns = [global('loss')];
      if (evalLoss.some(function (v) { return v !== null; })) {
        series.push(line('eval loss', palette[1], { spanGaps: true, points: { show: true, size: 7 } }));
        columns.push(evalLoss);
      }
      return stepChart('Loss', 'loss', series, columns);
    },
    lr: function () {
      return stepChart('Learning rate', 'lr', [line('lr', palette[2])], [global('lr')]);
    },
    grad_norm: function () {
      return stepChart('Gradient norm (before clipping)', 'norm', [line('grad norm', palette[4])],
                       [global('grad_norm')]);
    },
    experts: function () {
      var series = [line('fewest', palette[2]), line('mean', palette[0]), line('most', palette[1]),
                    line('load-balancing loss', palette[4], { scale: 'aux' })];
      var columns = [global('expert_tokens.min'), global('expert_tokens.mean'),
                     global('expert_tokens.max'), global('aux_loss')];
      var chart = stepChart('Tokens per expert (over layers and experts) and load-balancing loss',
                            'tokens', series, columns);
      chart.opts.axes.push(yAxis('loss', { scale: 'aux', side: 1, grid: { show: false } }));
      return chart;
    },
    throughput: function () {
      var tokens = global('tokens_per_s');
      var series = [line('tokens/s', palette[0])];
      var columns = [tokens];
      var withMfu = data.mfu.peak_flops && data.mfu.flops_per_token;
      if (withMfu) {
        series.push(line('MFU %', palette[3], { scale: '%' }));
        columns.push(tokens.map(function (t) {
          return t === null ? null : 100 * t * data.mfu.flops_per_token / data.mfu.peak_flops;
        }));
      }
      var chart = stepChart(withMfu ? 'Throughput and MFU' : 'Throughput', 'tokens/s', series,
                            columns);
      if (withMfu) {
        chart.opts.scales['%'] = { range: function (u, min, max) { return [0, Math.max(max, 1e-9) * 1.15]; } };
        chart.opts.axes.push(yAxis('MFU %', { scale: '%', side: 1, grid: { show: false } }));
      }
      return chart;
    },
    memory: function () {
      var series = ranks.map(function (r, i) { return line('rank ' + r, palette[i % palette.length]); });
      var columns = ranks.map(function (r) { return ofRank('mem.peak_rss', r, 1 / MiB); });
      return stepChart('Peak resident memory per rank', 'MiB', series, columns);
    },
    comm: function () {
      var seconds = meanOverRanks('comm.seconds');
      var exposed = meanOverRanks('comm.exposed_seconds');
      var series = [line('comm s (mean over ranks)', palette[0])];
      var columns = [seconds];
      var withExposed = col('comm.exposed_seconds') >= 0;
      if (withExposed) {
        series.push(line('exposed s', palette[1]));
        columns.push(exposed);
        series.push(line('hidden %', palette[2], { scale: '%', dash: [6, 4] }));
        columns.push(seconds.map(function (s, i) {
          return s && exposed[i] !== null ? 100 * (1 - exposed[i] / s) : null;
        }));
      }
      var chart = stepChart('Communication per step', 's', series, columns);
      if (withExposed) {
        chart.opts.scales['%'] = { range: [0, 100] };
        chart.opts.axes.push(yAxis('hidden %', { scale: '%', side: 1, grid: { show: false } }));
      }
      return chart;
    },
    scaling_tokens: function () { return scalingChart('tokens_per_s', 'Scaling: tokens/s', 'tokens/s', 1); },
    scaling_efficiency: function () {
      return scalingChart('efficiency', 'Scaling: efficiency', 'efficiency %', 100);
    },
  };

  // One series per strategy against the number of ranks (a log2 axis).
  function scalingChart(key, title, yLabel, scale) {
    var rows = data.scaling.rows;
    var xs = [];
    var strategies = [];
    rows.forEach(function (r) {
      if (xs.indexOf(r.ranks) < 0) xs.push(r.ranks);
      var s = r.strategy === undefined ? '' : String(r.strategy);
      if (strategies.indexOf(s) < 0) strategies.push(s);
    });
    xs.sort(function (a, b) { return a - b; });
    var columns = strategies.map(function (s) {
      return xs.map(function (x) {
        for (var i = rows.length - 1; i >= 0; i--) {
          var r = rows[i];
          if (String(r.strategy === undefined ? '' : r.strategy) === s && r.ranks === x) {
            return num(r[key]) === null ? null : r[key] * scale;
          }
        }
        return null;
      });
    });
    var allPositive = xs.every(function (x) { return x > 0; });
    return {
      opts: {
        title: title,
        height: 260,
        scales: { x: allPositive ? { time: false, distr: 3, log: 2 } : { time: false } },
        axes: [axis('ranks'), yAxis(yLabel)],
        series: [{ label: 'ranks' }].concat(strategies.map(function (s, i) {
          return line(s || 'run', palette[i % palette.length], { spanGaps: true, points: { show: true, size: 7 } });
        })),
      },
      data: [xs].concat(columns),
    };
  }

  var drawn = [];
  var placeholders = document.querySelectorAll('div.chart[data-chart]');
  for (var i = 0; i < placeholders.length; i++) {
    var el = placeholders[i];
    var name = el.getAttribute('data-chart');
    try {
      if (!builders[name]) throw new Error('no chart named ' + name);
      var chart = builders[name]();
      chart.opts.width = Math.max(300, el.clientWidth || 800);
      drawn.push({ plot: new uPlot(chart.opts, chart.data, el), el: el });
    } catch (e) {
      window.shardtrainRecordError('chart ' + name + ': ' + (e && e.message ? e.message : e));
    }
  }
  window.addEventListener('resize', function () {
    drawn.forEach(function (d) {
      d.plot.setSize({ width: Math.max(300, d.el.clientWidth), height: d.plot.height });
    });
  });
  document.body.setAttribute('data-charts', String(placeholders.length));
  document.body.setAttribute('data-rendered', String(drawn.length));
})();
