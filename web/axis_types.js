// Explicit mode's mesh axis types, one select per mesh axis (JAX's AxisType: Explicit, the
// default since JAX 0.9, or Auto, which the compiler places). The selects write the one setting
// `axis_types` in `--axis-types`' grammar (`tp=auto`: the axes that are not Explicit), which the
// link carries and the core checks; a refusal of one axis lands at its select.
import { el } from './dom.js';
import { runsExplicit } from './format.js';
import { meshAxes } from './mesh.js';

const TYPES = [
  ['explicit', 'Explicit: in the type, rules op by op'],
  ['auto', 'Auto: left to the compiler'],
];

const text = () => document.querySelector('#settings [name="axis_types"]');

/** A type given to an axis the mesh no longer has goes with the axis. Listens on the mesh's own
 * control, so the form reads the pruned setting. */
export function init() {
  const mesh = document.querySelector('#settings [name="mesh"]');
  mesh.addEventListener('change', () => {
    const axes = new Set((meshAxes(mesh.value) || []).map(([a]) => a));
    text().value = [...typesOf(text().value)].filter(([a]) => axes.has(a)).map(([a, t]) => `${a}=${t}`).join(',');
  });
}

/** The types `value` gives, by axis (unknown entries are the core's to refuse). */
function typesOf(value) {
  return new Map(value.split(',').map((e) => e.trim().split('=')).filter((p) => p.length === 2));
}

/** Shows a select per axis of `s.mesh` where explicit mode runs, or where types are set
 * without it (for their refusal to be seen), each at the type `s.axis_types` gives it. */
export function render(s) {
  const box = document.getElementById('axis-types');
  const runs = runsExplicit(s.mode);
  const axes = meshAxes(s.mesh) || [];
  box.hidden = !(runs || s.axis_types) || axes.length === 0;
  const given = typesOf(s.axis_types || '');
  document.getElementById('axis-type-rows').replaceChildren(...axes.map(([axis]) => {
    const select = el('select', { name: `axis_type.${axis}`, 'data-testid': `axis-type-${axis}`, 'aria-label': `type of mesh axis ${axis}` },
      ...TYPES.map(([value, words]) => el('option', { value }, words)));
    select.value = given.get(axis) || 'explicit';
    // A type given in a link that no option shows stays as given, for the core to refuse.
    if (select.value !== (given.get(axis) || 'explicit')) select.append(el('option', { value: given.get(axis), selected: '' }, given.get(axis)));
    // Written before the change reaches the form, which reads the setting.
    select.addEventListener('change', () => { text().value = written(); });
    return el('label', { class: 'axis-type' }, el('b', {}, axis), ' ', select);
  }));
}

/** The setting the selects say: each axis that is not Explicit, as `axis=type`. */
function written() {
  return [...document.querySelectorAll('#axis-type-rows select')]
    .filter((x) => x.value !== 'explicit')
    .map((x) => `${x.name.slice('axis_type.'.length)}=${x.value}`)
    .join(',');
}
