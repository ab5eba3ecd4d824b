// The mesh builder: the mesh as named axes, each with its size, added and removed one at a time
// (the core's axis kinds: what each splits), with the devices drawn as a grid labelled by their
// coordinates. It writes the one `mesh` control (`dp=2,tp=2,pp=2`, the link's key) and reads it
// back, so typing a mesh and building one agree. ZeRO's stage shows where the mesh has dp, and
// sequence parallelism where it has tp. ep (expert parallelism) is offered once the model has
// experts. Whether the model splits over the axes is the core's to say: its refusals land on the
// axis's size control (`mesh.tp`, `mesh.ep`).

let page = null; // {el, axes: [{name, splits}], coordText, deviceColor}

/** `dp=2,tp=2` as [['dp', 2], ['tp', 2]]; null where the text is not NAME=SIZE,... */
export function meshAxes(text) {
  if (!/^[A-Za-z_]\w{0,15}=\d{1,12}(,[A-Za-z_]\w{0,15}=\d{1,12}){0,7}$/.test(text || '')) return null;
  return text.split(',').map((part) => {
    const [name, size] = part.split('=');
    return [name, Number(size)];
  });
}

export const meshText = (axes) => axes.map(([n, s]) => `${n}=${s}`).join(',');

/** Whether the mesh text names the axis `name`. */
export const hasAxis = (text, name) => (meshAxes(text) || []).some(([n]) => n === name);

export function init(p) {
  page = p;
  const add = document.getElementById('mesh-add');
  add.replaceChildren(
    page.el('option', { value: '' }, 'add an axis…'),
    // The name alone fits a narrow select; what the axis splits shows on its row once added.
    ...page.axes.map((a) => page.el('option', { value: a.name, title: `splits ${a.splits}` }, a.name)),
  );
  add.addEventListener('change', () => {
    const name = add.value;
    add.value = '';
    const axes = meshAxes(meshInput().value) || [];
    // The select's own change then reaches the form, which reads the mesh written here.
    if (name && !axes.some(([n]) => n === name)) writeMesh([...axes, [name, 2]]);
  });
  meshInput().addEventListener('change', () => render());
  for (const name of ['zero', 'sequence_parallel', 'experts']) {
    document.querySelector(`#settings [name="${name}"]`).addEventListener('change', () => render());
  }
}

const meshInput = () => document.querySelector('#settings [name="mesh"]');

/** Writes `axes` into the mesh control and redraws. */
function writeMesh(axes) {
  meshInput().value = meshText(axes);
  render();
}

/** The axis rows, the add list, the options that refine an axis, and the device grid, from the mesh control. */
export function render() {
  const { el } = page;
  const axes = meshAxes(meshInput().value);
  const rows = document.getElementById('mesh-axes');
  const known = new Map(page.axes.map((a) => [a.name, a.splits]));
  rows.replaceChildren(...(axes || []).map(([name, size], i) => {
    const input = el('input', {
      name: `mesh.${name}`, type: 'number', min: '1', value: String(size), 'data-testid': `mesh-axis-${name}`,
      'aria-label': `size of mesh axis ${name}`,
    });
    // The size's own change then reaches the form, which reads the mesh written here (a size
    // that is no whole number is written as typed, for the grammar to refuse at the mesh).
    input.addEventListener('change', () => {
      const next = (meshAxes(meshInput().value) || []).slice();
      next[i] = [name, input.value.trim()];
      meshInput().value = meshText(next);
    });
    const remove = el('button', { type: 'button', class: 'small', 'data-testid': `mesh-remove-${name}`, title: `remove axis ${name}` }, '×');
    remove.addEventListener('click', () => {
      writeMesh((meshAxes(meshInput().value) || []).filter(([n]) => n !== name));
      meshInput().dispatchEvent(new Event('change', { bubbles: true }));
    });
    return el('div', { class: 'mesh-axis' },
      el('label', { class: 'mesh-axis-size' }, el('b', {}, name), ' ', input),
      axes.length > 1 ? remove : el('span'),
      el('span', { class: 'muted small mesh-axis-splits' }, `splits ${known.get(name) || 'nothing: not an axis kind shardlab knows'}`));
  }));
  const present = new Set((axes || []).map(([n]) => n));
  const settings = document.getElementById('settings');
  // ep splits a mixture's experts: offered where the model has some.
  const experts = Number(settings.elements.experts.value) > 0;
  for (const o of document.getElementById('mesh-add').options) {
    o.disabled = present.has(o.value);
    o.hidden = o.value === 'ep' && !experts;
  }
  // An option shows where its axis is, and stays shown while it is set without it: that is
  // where the core's refusal of it lands.
  document.getElementById('zero-field').hidden = !present.has('dp') && settings.elements.zero.value === '0';
  document.getElementById('sp-field').hidden = !present.has('tp') && !settings.elements.sequence_parallel.checked;
  drawGrid(axes);
}

/** Every device as a cell labelled by its coordinates: rows over the leading axes, columns over the last. */
function drawGrid(axes) {
  const { el } = page;
  const box = document.getElementById('mesh-grid');
  const n = axes ? axes.reduce((d, [, s]) => d * s, 1) : 0;
  if (!axes || !(n >= 1 && n <= 64)) {
    box.replaceChildren(el('p', { class: 'muted small' }, axes ? `${n > 64 ? 'more than 64' : n} devices: no grid drawn` : ''));
    return;
  }
  const cols = axes[axes.length - 1][1];
  const cells = [];
  for (let d = 0; d < n; d++) {
    const coords = page.coordText(d, axes);
    cells.push(el('span', {
      class: 'mesh-cell', 'data-testid': 'mesh-cell', 'data-device': String(d), title: `device ${d}: ${coords}`,
      style: `border-color: ${page.deviceColor(d, n)}`,
    }, el('b', {}, String(d)), el('small', {}, coords)));
  }
  const lead = axes.slice(0, -1).map(([a]) => a).join(' × ');
  box.replaceChildren(
    el('p', { class: 'muted small', 'data-testid': 'mesh-count' },
      `${n} simulated device${n === 1 ? '' : 's'}${lead ? `: a row per ${lead} coordinate,` : ':'} a column per ${axes[axes.length - 1][0]} coordinate`),
    el('div', { class: 'mesh-cells', style: `grid-template-columns: repeat(${cols}, minmax(0, 1fr))` }, ...cells),
  );
}
